/* Products of float32 rows with a matrix held as 4-bit codes (headwise.fast.int4.Int4:
 * a GGUF's Q4_0 / Q4_1 blocks): y (b, out) = x (b, in) @ W^T (+ bias) (+ res), where
 *   W[o, 32 g + i] = d[o, g] * q[o, 32 g + i] + m[o, g],   q in [0, 15],
 * codes (out, in / 2) bytes in headwise.fast.int4.pack's order (each row on its own: a row's
 * groups in blocks of 16, then the rest one by one), d and m (out, in / 32) float16.
 *
 * Why so: a decoding step's bytes are the weights, and these are 20 bytes per 32 weights where
 * float32 takes 128. The codes are unpacked in registers, never into a float copy, and the
 * group's d and m are applied once per group, not per weight:
 *   sum_i W[o, i] x_i = sum_g (d_g * sum_{i in g} q_i x_i + m_g * xs_g),  xs_g = sum_{i in g} x_i.
 * x is rounded to bfloat16 first (what torch's int4 kernel does, so both paths of
 * headwise.fast.int4 compute the same thing), once per call, together with xs, and put in the
 * order the codes unpack (prepare()); every product q_i x_i is exact and the sums are float32, in
 * the same order for any number of rows (a prompt's rows get the step's values).
 *
 * Two paths (step_kernels.h):
 * - AVX512-BF16: a nibble n OR'd with 0x4300 is the bfloat16 128 + n, so a shift, a mask and an
 *   OR (vpsrlw, vpternlogd) turn 16-bit words of four nibbles into 32 bfloat16 weights + 128,
 *   no shuffles. A block of 16 groups is four 64-byte loads; 32-bit lane L of each holds two
 *   weights of group L per shift, so 16 vdpbf16ps sum the block's 512 products into 16 float32
 *   lanes, one per group, and the 16 groups' d and their m - 128 d (the 128 in each weight
 *   taken back: sum_g (m_g - 128 d_g) xs_g) each apply with one FMA. The groups after the
 *   blocks: 4 per load, each 128-bit lane one group, d spread to its four lanes, the minima in
 *   128-bit lanes beside, masked loads for the last 1-3 (zeros, and zeros of x past the end);
 *   a last 1 or 2 (rows of 576 inputs, SmolLM2's 16 + 2 groups) for two rows of W in one load.
 * - AVX2: a block as eight 32-bit lanes at a time (32 FMAs against float32 x rounded to
 *   bfloat16 values, then d and m for the 8 groups at once); a tail group's 16 bytes widened to
 *   eight 32-bit words, four shifts and masks, four FMAs, d and m per group.
 * Both read one row of codes at a time front to back, several rows per pass, the codes 4 KiB
 * ahead asked for (ahead()), so each thread streams its block of rows. */
#include <stdlib.h>

#include "step_kernels.h"

#define GROUP 32

typedef struct {
    const uint8_t* codes;
    const uint16_t *d, *m;  /* float16 bits */
    const bf16* xq;         /* AVX512: rows of x as bfloat16, in the order the codes unpack */
    const float* xf;        /* AVX2: rows of x rounded to bfloat16, as float32 */
    const float* xs;        /* per row of x: each group's sum, padded with zeros to 4 groups */
    float* y;
    const float *res, *bias;
    long ldc, ldd, ldq, ldf, lds, ldy, ldr, groups;
} q4_args;

static inline void put(const q4_args* a, int b, long o, float s) {
    if (a->bias) s += a->bias[o];
    if (a->res) s += a->res[b * a->ldr + o];
    a->y[b * a->ldy + o] = s;
}

/* Rows o..o+n-1's codes, AHEAD bytes on, asked into L2 (prefetcht1). Why: the 210 products of
 * a step are each too short for the hardware's prefetchers to reach full speed on their own;
 * asking 4 KiB ahead made SmolLM2's 210 products 1.2-1.3x faster on a Zen 4 at batch 1
 * (benchmarks/q4_kernel.py; 2 and 8 KiB, prefetcht0, and asking for d and m too were slower).
 * A request past the end of the codes is harmless (a prefetch never faults). */
#define AHEAD 4096
INLINE void ahead(const q4_args* a, long o, int n) {
    const char* p = (const char*)(a->codes + o * a->ldc) + AHEAD;
    for (long i = 0; i < n * a->ldc; i += 64) _mm_prefetch(p + i, _MM_HINT_T1);
}

/* The lane sums of four vectors, each added in _mm512_reduce_add_ps's order (lanes L and L + 8,
 * then L + 4, L + 2, L + 1), so bit for bit its results, with fewer shuffles: halves() adds
 * lanes L and L + 8 of two vectors (a's in the low 256 bits, b's in the high), sums4_of() the
 * rest for two such. */
WIDE INLINE __m512 halves(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
}

WIDE INLINE __m128 sums4_of(__m512 u0, __m512 u1) {
    __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88),
                             _mm512_shuffle_f32x4(u0, u1, 0xdd));  /* + 4: a_r's in lanes 4r.. */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

WIDE INLINE __m128 sums4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    return sums4_of(halves(a0, a1), halves(a2, a3));
}

/* put() for outputs o..o+3 of row b of x at once (the same adds, in vectors). Why: four scalar
 * reads of a vector just stored wait on the store (no forwarding at those offsets). */
WIDE INLINE void put4(const q4_args* a, int b, long o, __m128 s) {
    if (a->bias) s = _mm_add_ps(s, _mm_loadu_ps(a->bias + o));
    if (a->res) s = _mm_add_ps(s, _mm_loadu_ps(a->res + b * a->ldr + o));
    _mm_storeu_ps(a->y + b * a->ldy + o, s);
}

#define AND_OR 0xea /* vpternlogd's table for (a & b) | c */
#define BLOCK 16    /* groups per block (codes layout, top of the file) */

/* Tail groups g..g+ng-1 (ng 3 or 4) of rows o..o+S-1 of W: four groups to a load, each 128-bit
 * lane one group, d spread to the group's four lanes; the minima in low4's 128-bit lanes. */
WIDE INLINE void tail4(const q4_args* a, long o, int S, int B, long g, long ng,
                       __m512 (*acc)[4], __m128 (*low4)[4]) {
    const __m512i low = _mm512_set1_epi16(0x000f), bias128 = _mm512_set1_epi16(0x4300);
    const __m512i lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m128 k128 = _mm_set1_ps(128.0f);
    __mmask64 cm = ng == 4 ? ~0ull : (1ull << (16 * ng)) - 1;
    __mmask8 c4 = (__mmask8)((1u << ng) - 1);
    __m512bh xv[4][4];
    for (int b = 0; b < B; b++) {
        const bf16* xb = a->xq + b * a->ldq + g * GROUP;
        for (int u = 0; u < 4; u++) xv[b][u] = (__m512bh)_mm512_loadu_si512(xb + 32 * u);
    }
    for (int r = 0; r < S; r++) {
        __m512i cv = _mm512_maskz_loadu_epi8(cm, a->codes + (o + r) * a->ldc + g * 16);
        __m512bh q0 = (__m512bh)_mm512_ternarylogic_epi32(cv, low, bias128, AND_OR);
        __m512bh q1 = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(cv, 4), low,
                                                          bias128, AND_OR);
        __m512bh q2 = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(cv, 8), low,
                                                          bias128, AND_OR);
        __m512bh q3 = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(cv, 12), bias128);
        __m128 d4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(c4, a->d + (o + r) * a->ldd + g));
        __m128 m4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(c4, a->m + (o + r) * a->ldd + g));
        __m128 e4 = _mm_fnmadd_ps(k128, d4, m4);
        __m512 dv = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(d4));
        for (int b = 0; b < B; b++) {
            __m512 s0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), q0, xv[b][0]);
            __m512 s1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), q2, xv[b][2]);
            s0 = _mm512_dpbf16_ps(s0, q1, xv[b][1]);
            s1 = _mm512_dpbf16_ps(s1, q3, xv[b][3]);
            acc[r][b] = _mm512_fmadd_ps(_mm512_add_ps(s0, s1), dv, acc[r][b]);
            low4[r][b] = _mm_fmadd_ps(e4, _mm_loadu_ps(a->xs + b * a->lds + g), low4[r][b]);
        }
    }
}

/* The last 1 or 2 groups of rows o and o + 1 (rows of 576 inputs: 16 + 2 groups): both rows'
 * codes in one 512-bit load (pair_of), against x's two groups repeated in the high 256 bits
 * (prepare()), so no vdpbf16ps lane idles (pair_dots); each row's d-scaled sums are added to
 * the low lanes of its acc, as tail2 adds them for a row on its own (the same values). */
typedef struct {
    __m512bh q[4];  /* the codes + 128, nibble k of each word */
    __m512 dv;      /* each group's d in its four lanes */
    __m128 e4[2];   /* each row's m - 128 d, per group */
} pair_codes;

WIDE INLINE pair_codes pair_of(const q4_args* a, long o, long g, long ng) {
    const __m512i low = _mm512_set1_epi16(0x000f), bias128 = _mm512_set1_epi16(0x4300);
    const __m512i lanes = _mm512_set_epi32(5, 5, 5, 5, 4, 4, 4, 4, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m128 k128 = _mm_set1_ps(128.0f);
    __mmask32 cm = ng == 2 ? ~0u : 0xffffu;
    __mmask8 c4 = (__mmask8)((1u << ng) - 1);
    const uint8_t *c0 = a->codes + o * a->ldc + g * 16, *c1 = a->codes + (o + 1) * a->ldc + g * 16;
    __m512i cv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi8(cm, c0)),
                                    _mm256_maskz_loadu_epi8(cm, c1), 1);
    pair_codes c;
    c.q[0] = (__m512bh)_mm512_ternarylogic_epi32(cv, low, bias128, AND_OR);
    c.q[1] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(cv, 4), low, bias128, AND_OR);
    c.q[2] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi16(cv, 8), low, bias128, AND_OR);
    c.q[3] = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(cv, 12), bias128);
    __m128 d4[2];
    for (int r = 0; r < 2; r++) {
        d4[r] = _mm_cvtph_ps(_mm_maskz_loadu_epi16(c4, a->d + (o + r) * a->ldd + g));
        __m128 m4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(c4, a->m + (o + r) * a->ldd + g));
        c.e4[r] = _mm_fnmadd_ps(k128, d4[r], m4);
    }
    c.dv = _mm512_permutexvar_ps(lanes,
                                 _mm512_insertf32x4(_mm512_castps128_ps512(d4[0]), d4[1], 1));
    return c;
}

/* The pair's d-scaled sums against x's vectors xv (row o's groups in the low 256 bits). */
WIDE INLINE __m512 pair_dots(const pair_codes* c, const __m512bh* xv) {
    __m512 s0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), c->q[0], xv[0]);
    __m512 s1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), c->q[2], xv[2]);
    s0 = _mm512_dpbf16_ps(s0, c->q[1], xv[1]);
    s1 = _mm512_dpbf16_ps(s1, c->q[3], xv[3]);
    return _mm512_mul_ps(_mm512_add_ps(s0, s1), c->dv);
}

WIDE INLINE void x_tail(const q4_args* a, int b, long g, __m512bh* xv) {
    const bf16* xb = a->xq + b * a->ldq + g * GROUP;
    for (int k = 0; k < 4; k++) xv[k] = (__m512bh)_mm512_loadu_si512(xb + 32 * k);
}

WIDE INLINE void tail2x2(const q4_args* a, long o, int B, long g, long ng,
                         __m512 (*acc)[4], __m128 (*low4)[4]) {
    pair_codes c = pair_of(a, o, g, ng);
    for (int b = 0; b < B; b++) {
        __m512bh xv[4];
        x_tail(a, b, g, xv);
        __m512 t = pair_dots(&c, xv);
        acc[0][b] = _mm512_mask_add_ps(acc[0][b], 0x00ff, acc[0][b], t);
        acc[1][b] = _mm512_mask_add_ps(acc[1][b], 0x00ff, acc[1][b],
                                       _mm512_shuffle_f32x4(t, t, 0xee));
        for (int r = 0; r < 2; r++)
            low4[r][b] = _mm_fmadd_ps(c.e4[r], _mm_loadu_ps(a->xs + b * a->lds + g), low4[r][b]);
    }
}

/* tail2x2 for one row, in the low 256 bits. */
WIDE INLINE void tail2(const q4_args* a, long o, int S, int B, long g, long ng,
                       __m512 (*acc)[4], __m128 (*low4)[4]) {
    const __m256i low = _mm256_set1_epi16(0x000f), bias128 = _mm256_set1_epi16(0x4300);
    const __m256i lanes = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
    const __m128 k128 = _mm_set1_ps(128.0f);
    __mmask32 cm = ng == 2 ? ~0u : 0xffffu;
    __mmask8 c4 = (__mmask8)((1u << ng) - 1);
    for (int r = 0; r < S; r++) {
        __m256i cv = _mm256_maskz_loadu_epi8(cm, a->codes + (o + r) * a->ldc + g * 16);
        __m256bh q0 = (__m256bh)_mm256_ternarylogic_epi32(cv, low, bias128, AND_OR);
        __m256bh q1 = (__m256bh)_mm256_ternarylogic_epi32(_mm256_srli_epi16(cv, 4), low,
                                                          bias128, AND_OR);
        __m256bh q2 = (__m256bh)_mm256_ternarylogic_epi32(_mm256_srli_epi16(cv, 8), low,
                                                          bias128, AND_OR);
        __m256bh q3 = (__m256bh)_mm256_or_si256(_mm256_srli_epi16(cv, 12), bias128);
        __m128 d4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(c4, a->d + (o + r) * a->ldd + g));
        __m128 m4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(c4, a->m + (o + r) * a->ldd + g));
        __m128 e4 = _mm_fnmadd_ps(k128, d4, m4);
        __m256 dv = _mm256_permutexvar_ps(lanes, _mm256_castps128_ps256(d4));
        for (int b = 0; b < B; b++) {
            const bf16* xb = a->xq + b * a->ldq + g * GROUP;
            __m256 s0 = _mm256_dpbf16_ps(_mm256_setzero_ps(), q0,
                                         (__m256bh)_mm256_loadu_si256((const __m256i*)xb));
            __m256 s1 = _mm256_dpbf16_ps(_mm256_setzero_ps(), q2,
                                         (__m256bh)_mm256_loadu_si256((const __m256i*)(xb + 64)));
            s0 = _mm256_dpbf16_ps(s0, q1, (__m256bh)_mm256_loadu_si256((const __m256i*)(xb + 32)));
            s1 = _mm256_dpbf16_ps(s1, q3, (__m256bh)_mm256_loadu_si256((const __m256i*)(xb + 96)));
            __m256 t = _mm256_add_ps(_mm512_castps512_ps256(acc[r][b]),
                                     _mm256_mul_ps(_mm256_add_ps(s0, s1), dv));
            acc[r][b] = _mm512_insertf32x8(acc[r][b], t, 0);
            low4[r][b] = _mm_fmadd_ps(e4, _mm_loadu_ps(a->xs + b * a->lds + g), low4[r][b]);
        }
    }
}

/* tail2x2 for rows o..o+3 (the two pairs' codes unpacked first, x's vectors loaded once for
 * both), then their sums, each pair's tail added where sums4 adds the pair's low halves, so
 * one add stands for tail2x2's two masked adds and shuffle and the +0 of the minima's lanes:
 * (acc[r] + the tail, in lanes 0-7) + the minima (lanes 0-3) + 0 (the rest), then lanes L and
 * L + 8, the same values as tail2x2, the minima's add and sums4 in turn. */
WIDE INLINE void last2x4(const q4_args* a, long o, int B, long g, long ng,
                         __m512 (*acc)[4], __m128 (*low4)[4]) {
    pair_codes c[2] = {pair_of(a, o, g, ng), pair_of(a, o + 2, g, ng)};
    for (int b = 0; b < B; b++) {
        __m512bh xv[4];
        x_tail(a, b, g, xv);
        __m128 xs4 = _mm_loadu_ps(a->xs + b * a->lds + g);
        __m512 u[2];
        for (int p = 0; p < 2; p++) {
            __m512 t = pair_dots(&c[p], xv);
            __m128 l0 = _mm_fmadd_ps(c[p].e4[0], xs4, low4[2 * p][b]);
            __m128 l1 = _mm_fmadd_ps(c[p].e4[1], xs4, low4[2 * p + 1][b]);
            __m512 mins = _mm512_insertf32x4(_mm512_zextps128_ps512(l0), l1, 2);
            __m512 lo = _mm512_shuffle_f32x4(acc[2 * p][b], acc[2 * p + 1][b], 0x44);
            __m512 hi = _mm512_shuffle_f32x4(acc[2 * p][b], acc[2 * p + 1][b], 0xee);
            lo = _mm512_add_ps(_mm512_add_ps(lo, t), mins);
            u[p] = _mm512_add_ps(lo, _mm512_add_ps(hi, _mm512_setzero_ps()));
        }
        put4(a, b, o, sums4_of(u[0], u[1]));
    }
}

/* Block g of rows o..o+S-1 of W against the B rows of x (rows_wide_s): the S * B chains of 16
 * vdpbf16ps, then each group's d and minimum applied into acc (first: acc starts at 0). */
WIDE INLINE void block16(const q4_args* a, long o, int S, int B, long g, int first,
                         __m512 (*acc)[4]) {
    const __m512i low = _mm512_set1_epi16(0x000f), bias128 = _mm512_set1_epi16(0x4300);
    const __m512 k128 = _mm512_set1_ps(128.0f);
    __m512 s[4][4];  /* one chain of 16 vdpbf16ps for each: the same order for any S and B */
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) s[r][b] = _mm512_setzero_ps();
    for (int u = 0; u < 4; u++) {
        __m512i cv[4];
        for (int r = 0; r < S; r++)
            cv[r] = _mm512_loadu_si512(a->codes + (o + r) * a->ldc + g * 16 + u * 64);
        for (int k = 0; k < 4; k++) {
            __m512bh xv[4];
            for (int b = 0; b < B; b++)
                xv[b] = (__m512bh)_mm512_loadu_si512(a->xq + b * a->ldq + g * GROUP + u * 128
                                                     + 32 * k);
            for (int r = 0; r < S; r++) {
                __m512i n = k ? _mm512_srli_epi16(cv[r], 4 * k) : cv[r];
                __m512bh q = (__m512bh)(k == 3 ? _mm512_or_si512(n, bias128)
                                        : _mm512_ternarylogic_epi32(n, low, bias128, AND_OR));
                for (int b = 0; b < B; b++) s[r][b] = _mm512_dpbf16_ps(s[r][b], q, xv[b]);
            }
        }
    }
    for (int r = 0; r < S; r++) {
        const uint16_t *d = a->d + (o + r) * a->ldd + g, *m = a->m + (o + r) * a->ldd + g;
        __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)d));
        __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)m));
        __m512 e = _mm512_fnmadd_ps(k128, dv, mv);  /* m - 128 d: the 128 in each weight */
        for (int b = 0; b < B; b++) {
            __m512 t = _mm512_fmadd_ps(s[r][b], dv, first ? _mm512_setzero_ps() : acc[r][b]);
            acc[r][b] = _mm512_fmadd_ps(e, _mm512_loadu_ps(a->xs + b * a->lds + g), t);
        }
    }
}

/* Rows o..o+S-1 of W against the B rows of x (S, B <= 4). Blocks of 16 groups: four loads of
 * 64 bytes, each unpacked (shift, mask, or) into four vectors of 32 bfloat16 weights + 128,
 * dword lane L holding two weights of group L; 16 vdpbf16ps sum the block's 512 products into
 * the 16 lanes, one per group, so each group's d and minimum apply with one FMA each for all
 * 16. Then the tail groups, 4 per step, each 128-bit lane one group (d spread to its lanes).
 * The loop goes (u, k, r, b): each x vector is loaded once for the S rows of W and each
 * unpacked q serves the B rows of x, so at S = B = 4 a vdpbf16ps needs 0.3 loads, and the
 * S * B chains (one per output, 16 steps a block, in the same (u, k) order for any S and B)
 * keep vdpbf16ps's 6-cycle latency covered (it issues one a cycle on Zen 4). Holding x for
 * two rows of W instead (the loop (u, r, k, b), 2 x 4 chains) spilled and ran 2.8 cycles a
 * vdpbf16ps at B = 4; this runs 1.1 in the block loop, 1.3 with each block's d and minimum
 * FMAs (which take the same two pipes), ~1.5 with SmolLM2's tail of 2 groups (in L1, Zen 4).
 * The first block is taken apart from the rest so that with one block (rows of 576 inputs)
 * acc is not held across the loop (no spills). */
WIDE INLINE void rows_wide_s(const q4_args* a, long o, int S, int B) {
    __m512 acc[4][4];
    long full = a->groups / BLOCK * BLOCK;
    if (full)
        block16(a, o, S, B, 0, 1, acc);
    else
        for (int r = 0; r < S; r++)
            for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
    for (long g = BLOCK; g < full; g += BLOCK) block16(a, o, S, B, g, 0, acc);
    __m128 low4[4][4];  /* the tail's minima, four groups to a lane */
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) low4[r][b] = _mm_setzero_ps();
    for (long g = full; g < a->groups; g += 4) {
        long ng = a->groups - g < 4 ? a->groups - g : 4;
        if (ng <= 2 && S == 4) {
            last2x4(a, o, B, g, ng, acc, low4);
            return;
        }
        if (ng > 2)
            tail4(a, o, S, B, g, ng, acc, low4);
        else if (S % 2 == 0)
            for (int r = 0; r < S; r += 2) tail2x2(a, o + r, B, g, ng, acc + r, low4 + r);
        else
            tail2(a, o, S, B, g, ng, acc, low4);
    }
    if (full < a->groups)
        for (int r = 0; r < S; r++)
            for (int b = 0; b < B; b++)
                acc[r][b] = _mm512_add_ps(acc[r][b], _mm512_zextps128_ps512(low4[r][b]));
    if (S == 4) {
        for (int b = 0; b < B; b++)
            put4(a, b, o, sums4(acc[0][b], acc[1][b], acc[2][b], acc[3][b]));
        return;
    }
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) put(a, b, o + r, _mm512_reduce_add_ps(acc[r][b]));
}

/* [o0, o1): STREAMS rows of W per pass (more sums in flight, the x loads shared), the last
 * 1-3 rows one at a time, with a constant B each. Each pass first asks for the codes AHEAD
 * bytes on (ahead()). */
#define STREAMS 4
WIDE static void rows_wide(const q4_args* a, int B, long o0, long o1) {
    long o = o0;
    for (; o + STREAMS <= o1; o += STREAMS) {
        ahead(a, o, STREAMS);
        switch (B) {
            case 1: rows_wide_s(a, o, STREAMS, 1); break;
            case 2: rows_wide_s(a, o, STREAMS, 2); break;
            case 3: rows_wide_s(a, o, STREAMS, 3); break;
            default: rows_wide_s(a, o, STREAMS, 4); break;
        }
    }
    for (; o < o1; o++) switch (B) {
        case 1: rows_wide_s(a, o, 1, 1); break;
        case 2: rows_wide_s(a, o, 1, 2); break;
        case 3: rows_wide_s(a, o, 1, 3); break;
        default: rows_wide_s(a, o, 1, 4); break;
    }
}

/* ---- AVX2 -------------------------------------------------------------------------------- */

/* Row o of W against the B rows of x: blocks of 16 groups in two halves of 8 (eight dword lanes,
 * one group each: 32 FMAs of float32 codes against x, then d and the minimum for the 8 at
 * once), then the tail one group (16 bytes of codes) per step. */
NARROW_F16C INLINE void row_narrow(const q4_args* a, long o, int B) {
    const __m256i low = _mm256_set1_epi32(0x0f);
    __m256 acc[4];
    float z[4] = {0};
    for (int b = 0; b < B; b++) acc[b] = _mm256_setzero_ps();
    const uint8_t* c = a->codes + o * a->ldc;
    const uint16_t *d = a->d + o * a->ldd, *m = a->m + o * a->ldd;
    long full = a->groups / BLOCK * BLOCK;
    for (long g = 0; g < full; g += 8) {  /* 8 groups: half h of block g / 16 */
        long h = g % BLOCK / 8;
        __m256 s[4][2];
        for (int b = 0; b < B; b++) s[b][0] = s[b][1] = _mm256_setzero_ps();
        for (int u = 0; u < 4; u++) {
            const uint8_t* part = c + (g - 8 * h) * 16 + u * 64 + h * 32;
            __m256i w = _mm256_loadu_si256((const __m256i*)part);
            for (int j = 0; j < 8; j++) {  /* word j / 4, nibble j % 4 */
                __m256i n = _mm256_srli_epi32(w, 16 * (j / 4) + 4 * (j % 4));
                __m256 f = _mm256_cvtepi32_ps(j == 7 ? n : _mm256_and_si256(n, low));
                for (int b = 0; b < B; b++)
                    s[b][j % 2] = _mm256_fmadd_ps(
                        f, _mm256_loadu_ps(a->xf + b * a->ldf + g * GROUP + (u * 8 + j) * 8),
                        s[b][j % 2]);
            }
        }
        __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + g)));
        __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(m + g)));
        for (int b = 0; b < B; b++) {
            acc[b] = _mm256_fmadd_ps(_mm256_add_ps(s[b][0], s[b][1]), dv, acc[b]);
            acc[b] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(a->xs + b * a->lds + g), acc[b]);
        }
    }
    for (long g = full; g < a->groups; g++) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(c + g * 16)));
        __m256 f0 = _mm256_cvtepi32_ps(_mm256_and_si256(w, low));
        __m256 f1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(w, 4), low));
        __m256 f2 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(w, 8), low));
        __m256 f3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 12));
        __m256 dv = _mm256_set1_ps(_cvtsh_ss(d[g]));
        float mg = _cvtsh_ss(m[g]);
        for (int b = 0; b < B; b++) {
            const float* xb = a->xf + b * a->ldf + g * GROUP;
            __m256 t0 = _mm256_mul_ps(f0, _mm256_loadu_ps(xb));
            __m256 t1 = _mm256_mul_ps(f1, _mm256_loadu_ps(xb + 8));
            t0 = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xb + 16), t0);
            t1 = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xb + 24), t1);
            acc[b] = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), dv, acc[b]);
            z[b] += mg * a->xs[b * a->lds + g];
        }
    }
    for (int b = 0; b < B; b++) put(a, b, o, sum8(acc[b]) + z[b]);
}

NARROW_F16C static void rows_narrow(const q4_args* a, int B, long o0, long o1) {
    for (long o = o0; o < o1; o++) {
        ahead(a, o, 1);
        switch (B) {
            case 1: row_narrow(a, o, 1); break;
            case 2: row_narrow(a, o, 2); break;
            case 3: row_narrow(a, o, 3); break;
            default: row_narrow(a, o, 4); break;
        }
    }
}

/* ---- entry ------------------------------------------------------------------------------- */

/* prepare() for a block of 16 groups of one row of x on the wide path, in vectors: each group's
 * 32 values rounded as to_bf16 does (integer steps, so denormals too) and put in (u, k, p)
 * order (vpermw), the 16 groups' dword (u, k) gathered into vector (u, k), and the groups'
 * sums added front to back in the lanes (weight 8 u + 4 p + k of each group is word p of
 * vector (u, k)'s lanes): the same bits as the scalar steps, ~15x fewer cycles. */
WIDE static void block_row(const float* x, bf16* q, float* xs) {
    const __m512i round = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  quiet = _mm512_set1_epi32(0x40), high = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i order = _mm512_set_epi16(  /* word 2 (4 u + k) + p <- word 8 u + 4 p + k */
        31, 27, 30, 26, 29, 25, 28, 24, 23, 19, 22, 18, 21, 17, 20, 16,
        15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0);
    uint32_t tmp[BLOCK][16] __attribute__((aligned(64)));
    for (int L = 0; L < BLOCK; L++) {
        __m256i h[2];
        for (int c = 0; c < 2; c++) {
            __m512i u = _mm512_loadu_si512(x + L * GROUP + 16 * c);
            __m512i r = _mm512_srli_epi32(_mm512_add_epi32(
                u, _mm512_add_epi32(round, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
            r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
            h[c] = _mm512_cvtepi32_epi16(r);
        }
        __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(h[0]), h[1], 1);
        _mm512_store_si512(tmp[L], _mm512_permutexvar_epi16(order, w));
    }
    const __m512i lanes = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80,
                                           64, 48, 32, 16, 0);
    __m512i v[4][4];
    for (int u = 0; u < 4; u++)
        for (int k = 0; k < 4; k++) {
            v[u][k] = _mm512_i32gather_epi32(_mm512_add_epi32(lanes, _mm512_set1_epi32(4 * u + k)),
                                             tmp, 4);
            _mm512_storeu_si512(q + (4 * u + k) * 32, v[u][k]);
        }
    __m512 s = _mm512_setzero_ps();
    for (int u = 0; u < 4; u++)
        for (int p = 0; p < 2; p++)
            for (int k = 0; k < 4; k++)
                s = _mm512_add_ps(s, _mm512_castsi512_ps(p ? _mm512_and_si512(v[u][k], high)
                                                           : _mm512_slli_epi32(v[u][k], 16)));
    _mm512_storeu_ps(xs, s);
}

/* x rounded to bfloat16 once per call (into t, `in` values), each group's sum, and the row in
 * the order the path's codes unpack (top of the file), written front to back:
 * - wide, a block of 16 groups: vector (u, k) of 32 bfloat16 holds in lane L (2 L, 2 L + 1)
 *   weights 8 u + k and 8 u + 4 + k of group L (word p of dword L after nibble shift k);
 * - narrow, a block: vector (half h, u, p, k) of 8 float32 holds weight 8 u + 4 p + k of
 *   groups 8 h .. 8 h + 7;
 * - the tail: four groups to a block of 128 bfloat16, weight 8 u + j of group g % 4 at
 *   32 u + 8 (g % 4) + j (wide; zeros past the last group, except that a last four of 1 or 2
 *   groups repeats them in its high 256 bits: tail2x2), a group's 32 in order (narrow). */
static void prepare(const float* x, long ldx, int rows, long in, int wide, bf16* xq, float* xf,
                    float* xs, long lds, bf16* t) {
    long groups = in / GROUP, padded = lds * GROUP, full = groups / BLOCK * BLOCK;
    for (int b = 0; b < rows; b++) {
        const float* xb = x + b * ldx;
        long from = wide ? full * GROUP : 0;  /* (the wide path's blocks: block_row()) */
        for (long j = from; j < in; j++) t[j] = to_bf16(xb[j]);
        for (long g = from / GROUP; g < lds; g++) {
            float s = 0.0f;
            for (long i = 0; g < groups && i < GROUP; i++) s += from_bf16(t[g * GROUP + i]);
            xs[b * lds + g] = s;
        }
        if (wide) {
            for (long g = 0; g < full; g += BLOCK)
                block_row(xb + g * GROUP, xq + b * padded + g * GROUP, xs + b * lds + g);
            for (long g = full; g < lds; g++)
                for (long i = 0; i < GROUP; i++)
                    xq[b * padded + g / 4 * 128 + (i / 8) * 32 + (g % 4) * 8 + i % 8] =
                        g < groups ? t[g * GROUP + i] : 0;
            if (lds - groups >= 2)  /* a last step of 1 or 2 groups: repeated (tail2x2) */
                for (int u = 0; u < 4; u++) {
                    bf16* v = xq + b * padded + (lds - 4) * GROUP + 32 * u;
                    memcpy(v + 16, v, 16 * sizeof(bf16));
                }
        } else {
            float* f = xf + b * in;
            for (long g = 0; g < full; g += BLOCK)
                for (int h = 0; h < 2; h++)
                    for (int w = 0; w < GROUP; w++)  /* w = 8 u + 4 p + k */
                        for (int L = 0; L < 8; L++)
                            *f++ = from_bf16(t[(g + 8 * h + L) * GROUP + w]);
            for (long j = full * GROUP; j < in; j++) *f++ = from_bf16(t[j]);
        }
    }
}

/* Rows of x in fours against blocks of TILE rows of W: a block's codes (TILE * in / 2 bytes)
 * stay in L1 while every four rows of x pass over them, so W is read from memory once however
 * many rows there are (a prompt: the module path multiplies by the same kernel as the step,
 * so both compute the same values). */
#define TILE 32
static void tiles(const q4_args* a, int rows, long o0, long o1, int wide) {
    for (long t = o0; t < o1; t += TILE) {
        long t1 = t + TILE < o1 ? t + TILE : o1;
        for (int c = 0; c < rows; c += 4) {
            q4_args four = *a;
            four.xq = a->xq + (wide ? c * a->ldq : 0);
            four.xf = a->xf + (wide ? 0 : c * a->ldf);
            four.xs = a->xs + c * a->lds;
            four.y = a->y + c * a->ldy;
            four.res = a->res ? a->res + c * a->ldr : 0;
            int b = rows - c < 4 ? rows - c : 4;
            if (wide)
                rows_wide(&four, b, t, t1);
            else
                rows_narrow(&four, b, t, t1);
        }
    }
}

/* Returns 0; 1 when rows < 1 or in is not a multiple of 32; 2 when scratch memory could not be
 * had (nothing written either way). */
int headwise_q4_matmul(const float* x, long ldx, const uint8_t* codes, const uint16_t* d,
                       const uint16_t* m, float* y, long ldy, const float* res, long ldr,
                       const float* bias, int rows, long out, long in, int threads, int wide) {
    if (rows < 1 || in % GROUP) return 1;
    long groups = in / GROUP, lds = (groups + 3) / 4 * 4;
    size_t nq = wide ? (size_t)(rows * lds * GROUP) : 0, nf = wide ? 0 : (size_t)(rows * in);
    void* scratch = malloc(nq * sizeof(bf16) + nf * sizeof(float) + rows * lds * sizeof(float)
                           + in * sizeof(bf16));
    if (!scratch) return 2;
    float* xs = scratch;
    float* xf = xs + rows * lds;
    bf16* xq = (bf16*)(xf + nf);
    prepare(x, ldx, rows, in, wide, xq, xf, xs, lds, xq + nq);
    q4_args a = {codes, d, m, xq, xf, xs, y, res, bias,
                 in / 2, groups, lds * GROUP, in, lds, ldy, ldr, groups};
    OVER_OUTPUTS(out, tiles(&a, rows, o0, o1, wide));
    free(scratch);
    return 0;
}
