/* bfloat16 products of 1 to 4 rows (headwise.fast.native says why these kernels exist):
 * y (b, out) = x (b, in) @ W^T (+ bias) (+ res), every tensor bfloat16, W (out, in) with
 * contiguous rows. Each output is one float32 sum of exact products (a bfloat16 times a
 * bfloat16 has 16 significant bits), bias and residual added in float32, then rounded to
 * bfloat16 once: what torch's bfloat16 F.linear does up to the order of the sums (torch rounds
 * the product before adding a residual; this rounds once, so it is never further from the exact
 * value).
 *
 * A decoding step reads every weight once, so these read W at the speed memory delivers it:
 * each thread reads its block of W front to back as four long streams (its four quarters, one
 * row of each per pass), x (in L1) loaded once per pass for the four. Several *adjacent* rows
 * per pass (as the float32 kernel does) keep short streams in flight instead: for SmolLM2's
 * 576-wide rows (1152 bytes) eight such streams read ~11.5 GB/s on this project's Zen 4 where
 * one row at a time reads ~24 (and a plain sum over a buffer ~20). Two paths, picked by the
 * caller's `wide` (step_kernels.h):
 * - AVX512-BF16: vdpbf16ps takes 32 bfloat16 of W and of x and adds the 16 pair sums into
 *   float32 lanes: no widening at all; the tail of a row (in % 64) through masked loads, which
 *   read zeros past the end.
 * - AVX2: a bfloat16 is the high half of a float32, so 16 of them (one 256-bit load) widen by
 *   one shift (the even ones) and one AND (the odd ones) into two float32 vectors, which x
 *   matches by the same split; two FMAs. The tail (in % 32) one product at a time. */
#include <math.h>

#include "step_kernels.h"

typedef struct {
    const bf16 *x, *w, *res, *bias;
    bf16* y;
    long ldx, ldw, ldy, ldr, n;
} bf16_args;

/* y[b, o] = bfloat16(s + bias[o] + res[b, o]) */
static inline void put(const bf16_args* a, int b, long o, float s) {
    if (a->bias) s += from_bf16(a->bias[o]);
    if (a->res) s += from_bf16(a->res[b * a->ldr + o]);
    a->y[b * a->ldy + o] = to_bf16(s);
}

/* ---- AVX512-BF16 ---------------------------------------------------------------------- */

#define STREAMS 4 /* rows of W read per pass (rows_wide) */

/* Four rows of x read three streams of W (rows_wide), and with the arithmetic of four rows per
 * weight the hardware's prefetchers fall behind: each stream's W is asked into L2 AHEAD bytes
 * on (prefetcht1), one request per 64-byte line. On this project's Zen 4 that took SmolLM2's
 * 49152 x 576 head at four rows from 23.5 to 36.1 GB/s at 1 thread (benchmarks/bf16_kernel.py,
 * "head"); 1 and 4 KiB ahead, prefetcht0, and the same for 2 and 3 rows (four streams) were
 * slower. */
#define AHEAD 8192

/* 32 bfloat16 at p; the first n only when n < 32 (a masked load: zeros past them) */
WIDE INLINE __m512bh load32(const bf16* p, long n) {
    if (n >= 32) return (__m512bh)_mm512_loadu_si512(p);
    return (__m512bh)_mm512_maskz_loadu_epi16((__mmask32)((1u << n) - 1), p);
}

/* Rows o[0..S-1] of W against one row of x (B = 1), 32 weights per step: x's 32 loaded once
 * for the S rows, one sum per row of W. */
WIDE INLINE void pass_wide(const bf16_args* a, const long* o, int S, int B) {
    __m512 acc[4][4];
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
    for (long k = 0, n = a->n; k < n; k += 32) {
        __m512bh xv[4];
        for (int b = 0; b < B; b++) xv[b] = load32(a->x + b * a->ldx + k, n - k);
        for (int r = 0; r < S; r++) {
            __m512bh wv = load32(a->w + o[r] * a->ldw + k, n - k);
            for (int b = 0; b < B; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wv, xv[b]);
        }
    }
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) put(a, b, o[r], _mm512_reduce_add_ps(acc[r][b]));
}

/* 16 bfloat16 at p as float32 */
WIDE INLINE __m512 widen16(const uint16_t* p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

/* The sums of the lanes of v[0..n-1] (n <= 16) in lanes REDUCED(0..n-1), each in
 * _mm512_reduce_add_ps's order (the upper 256 bits plus the lower, then 128-bit halves, lanes
 * 0 + 2 and 1 + 3, then those two), but four vectors' halves added by one instruction at each
 * level: 15 adds and 30 shuffles for 16 sums instead of 16 x 4 adds and 4 extractions. */
#define REDUCED(i) (4 * ((i) % 4) + (i) / 4) /* v[i]'s sum: lane 4 j + p holds v[4 p + j] */
WIDE INLINE __m512 reduce16(__m512* v, int n) {
    for (int i = n; i < 16; i++) v[i] = _mm512_setzero_ps();
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++) /* v[2i]'s eight half sums, then v[2i + 1]'s */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++) /* 128-bit part j: v[4i + j]'s four */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; i++) /* part j: two of v[8i + j], two of v[8i + 4 + j] */
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xdd));
}

/* put() for the S B sums of rows o[0..S-1] of W and the B rows of x, s[REDUCED(r B + b)]:
 * bias and residual added as put adds them (none added when absent: s + 0 would turn -0 into
 * +0), each rounded to bfloat16 as to_bf16 rounds (in integer lanes: vcvtneps2bf16 would
 * flush subnormals), then stored one by one. */
WIDE INLINE void put16(const bf16_args* a, const long* o, int S, int B, __m512 s) {
    uint16_t add[16] = {0}, h[16];
    if (a->bias) {
        for (int i = 0; i < S * B; i++) add[REDUCED(i)] = a->bias[o[i / B]];
        s = _mm512_add_ps(s, widen16(add));
    }
    if (a->res) {
        for (int i = 0; i < S * B; i++) add[REDUCED(i)] = a->res[i % B * a->ldr + o[i / B]];
        s = _mm512_add_ps(s, widen16(add));
    }
    __m512i u = _mm512_castps_si512(s), top = _mm512_srli_epi32(u, 16), near = bf16_near16(s);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                           _mm512_set1_epi32(0x7f800000));
    __m512i r = _mm512_mask_or_epi32(_mm512_srli_epi32(near, 16), nan, top,
                                     _mm512_set1_epi32(0x40));
    _mm256_storeu_si256((__m256i*)h, _mm512_cvtepi32_epi16(r));
    for (int i = 0; i < S * B; i++) a->y[i % B * a->ldy + o[i / B]] = h[REDUCED(i)];
}

/* Rows o[0..S-1] of W against B >= 2 rows of x, 64 weights per step in two sums per row of W
 * and of x (weights 0-31 and 32-63 of each step, added at the end: the order of sums one row
 * of W at a time had, so the results are the same bit for bit). Each half-step loads the 32
 * weights of each of the S rows of W and of each of the B rows of x once: 2 S B sums in
 * registers, and the smaller of the two sets held (B rows of x and one row of W at a time when
 * B < S, else S rows of W and one of x): 28 of the 32 at most, where holding the 64 weights of
 * every row and both halves of x spilled sums to the stack (and, for S = 4 and B = 3, holding
 * the S rows let the compiler reload W for every row of x instead). S and B are constants in
 * every call (unrolled). */
WIDE INLINE void rows_s_wide(const bf16_args* a, const long* o, int S, int B) {
    __m512 acc[STREAMS][4][2];
    const bf16* w[STREAMS];
    for (int r = 0; r < S; r++) {
        w[r] = a->w + o[r] * a->ldw;
        for (int b = 0; b < B; b++) acc[r][b][0] = acc[r][b][1] = _mm512_setzero_ps();
    }
    long k = 0, n = a->n;
    for (; k + 64 <= n; k += 64) {
        if (B == 4)
            for (int r = 0; r < S; r++)
                for (int line = 0; line < 128; line += 64)
                    _mm_prefetch((const char*)(w[r] + k) + AHEAD + line, _MM_HINT_T1);
        for (int h = 0; h < 2; h++)
            if (B < S) { /* the B rows of x held, each row of W loaded once */
                __m512bh xv[4];
                for (int b = 0; b < B; b++) xv[b] = load32(a->x + b * a->ldx + k + 32 * h, 32);
                for (int r = 0; r < S; r++) {
                    __m512bh wv = load32(w[r] + k + 32 * h, 32);
                    for (int b = 0; b < B; b++)
                        acc[r][b][h] = _mm512_dpbf16_ps(acc[r][b][h], wv, xv[b]);
                }
            } else { /* the S rows of W held, each row of x loaded once */
                __m512bh wv[STREAMS];
                for (int r = 0; r < S; r++) wv[r] = load32(w[r] + k + 32 * h, 32);
                for (int b = 0; b < B; b++) {
                    __m512bh xv = load32(a->x + b * a->ldx + k + 32 * h, 32);
                    for (int r = 0; r < S; r++)
                        acc[r][b][h] = _mm512_dpbf16_ps(acc[r][b][h], wv[r], xv);
                }
            }
    }
    for (; k < n; k += 32) {
        __m512bh wv[STREAMS];
        for (int r = 0; r < S; r++) wv[r] = load32(w[r] + k, n - k);
        for (int b = 0; b < B; b++) {
            __m512bh xv = load32(a->x + b * a->ldx + k, n - k);
            for (int r = 0; r < S; r++) acc[r][b][0] = _mm512_dpbf16_ps(acc[r][b][0], wv[r], xv);
        }
    }
    __m512 v[16];
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) v[r * B + b] = _mm512_add_ps(acc[r][b][0], acc[r][b][1]);
    put16(a, o, S, B, reduce16(v, S * B));
}

/* [o0, o1) as S contiguous parts, one row of each per pass: S long front-to-back streams,
 * which a core reads faster than one (~26 against ~23 GB/s here), x's loads shared by the S
 * rows. One row of x: 32 weights per step, S = 4; 2-4 rows: 64 (rows_s_wide), S = 4 for two or
 * three rows of x and 3 for four (2 S B sums, S weights and one x fit the 32 registers). S and
 * B are constants in every call: with S chosen at run time (session 16) the sums lived on the
 * stack, and four rows of x ran ~14 of vdpbf16ps's 32 products a cycle on a 576 x 576 matrix
 * in cache; now ~25, the rest mostly each pass's reduction (benchmarks/bf16_kernel.py). */
#define PASS(o, S, B) ((B) == 1 ? pass_wide(a, o, S, 1) : rows_s_wide(a, o, S, B))
#define PASSES(S, B)                                                                      \
    do {                                                                                  \
        long per = (o1 - o0) / (S), o[STREAMS];                                           \
        for (long i = 0; i < per; i++) {                                                  \
            for (int r = 0; r < (S); r++) o[r] = o0 + r * per + i;                        \
            PASS(o, S, B);                                                                \
        }                                                                                 \
        for (long r = o0 + (S) * per; r < o1; r++) PASS(&r, 1, B); /* the rest */         \
    } while (0)
WIDE static void rows_wide(const bf16_args* a, int B, long o0, long o1) {
    switch (B) { /* constant S and B in each call: unrolled, the sums in registers */
        case 1: PASSES(4, 1); break;
        case 2: PASSES(4, 2); break;
        case 3: PASSES(4, 3); break;
        default: PASSES(3, 4); break;
    }
}
#undef PASSES
#undef PASS

/* ---- AVX2 -------------------------------------------------------------------------------- */

/* 16 bfloat16 at p as float32: the even-numbered ones and the odd-numbered ones. */
INLINE void widen(const bf16* p, __m256* even, __m256* odd) {
    __m256i v = _mm256_loadu_si256((const __m256i*)p);
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* Row o of W against the B rows of x, 32 weights per step in two sums per row of x. */
INLINE void row_narrow(const bf16_args* a, long o, int B) {
    __m256 acc[4][2];
    for (int b = 0; b < B; b++) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    const bf16* w = a->w + o * a->ldw;
    long k = 0, n = a->n;
    for (; k + 32 <= n; k += 32) {
        __m256 we0, wo0, we1, wo1;
        widen(w + k, &we0, &wo0);
        widen(w + k + 16, &we1, &wo1);
        for (int b = 0; b < B; b++) {
            __m256 xe, xo;
            widen(a->x + b * a->ldx + k, &xe, &xo);
            acc[b][0] = _mm256_fmadd_ps(wo0, xo, _mm256_fmadd_ps(we0, xe, acc[b][0]));
            widen(a->x + b * a->ldx + k + 16, &xe, &xo);
            acc[b][1] = _mm256_fmadd_ps(wo1, xo, _mm256_fmadd_ps(we1, xe, acc[b][1]));
        }
    }
    for (int b = 0; b < B; b++) {
        float s = sum8(_mm256_add_ps(acc[b][0], acc[b][1]));
        const bf16* xb = a->x + b * a->ldx;
        for (long kk = k; kk < n; kk++) s += from_bf16(w[kk]) * from_bf16(xb[kk]);
        put(a, b, o, s);
    }
}

static void rows_narrow(const bf16_args* a, int B, long o0, long o1) {
    for (long o = o0; o < o1; o++) switch (B) {
        case 1: row_narrow(a, o, 1); break;
        case 2: row_narrow(a, o, 2); break;
        case 3: row_narrow(a, o, 3); break;
        default: row_narrow(a, o, 4); break;
    }
}

/* Returns 0, or 1 when rows is not 1..4 (nothing written). */
int headwise_rows_matmul_bf16(const bf16* x, long ldx, const bf16* w, long ldw, bf16* y,
                              long ldy, const bf16* res, long ldr, const bf16* bias, int rows,
                              long out, long in, int threads, int wide) {
    if (rows < 1 || rows > 4) return 1;
    bf16_args a = {x, w, res, bias, y, ldx, ldw, ldy, ldr, in};
    if (wide)
        OVER_OUTPUTS(out, rows_wide(&a, rows, o0, o1));
    else
        OVER_OUTPUTS(out, rows_narrow(&a, rows, o0, o1));
    return 0;
}

/* ---- the step's other row operations in bfloat16 ----------------------------------------- */

/* RoPE on bfloat16 rows: headwise_rope_rows (step_kernels.c) with each product and the sum
 * rounded to bfloat16, as torch's bfloat16 mul, mul, add round them (a product of two
 * bfloat16 is exact in float32, and so is rounding it once): bit for bit
 * headwise.rope.RotaryEmbedding.rotate on bfloat16. Returns 1 when the first `check` features
 * of every row are finite afterwards, else 0. */
int headwise_rope_rows_bf16(bf16* x, long rows, long ldx, long heads, long d, long r,
                            const bf16* cos, const bf16* sin, long check) {
    long half = r / 2;
    int finite = 1;
    for (long i = 0; i < rows; i++) {
        bf16* row = x + i * ldx;
        for (long h = 0; h < heads; h++) {
            bf16* a = row + h * d;
            bf16* b = a + half;
            for (long k = 0; k < half; k++) {
                float av = from_bf16(a[k]), bv = from_bf16(b[k]);
                float ta = from_bf16(to_bf16(av * from_bf16(cos[k])));
                float tb = from_bf16(to_bf16(bv * from_bf16(sin[k])));
                float ua = from_bf16(to_bf16(bv * from_bf16(cos[half + k])));
                float ub = from_bf16(to_bf16(av * from_bf16(sin[half + k])));
                a[k] = to_bf16(ta + tb);
                b[k] = to_bf16(ua + ub);
            }
        }
        for (long k = 0; k < check; k++) {
            float v = from_bf16(row[k]);
            finite &= (v - v) == 0.0f; /* NaN or inf: not 0 */
        }
    }
    return finite;
}

/* RMSNorm of bfloat16 rows in Hugging Face's LlamaRMSNorm order (headwise.models.norms):
 * statistics in float32 (here the mean of squares accumulated in double, as the float32 kernel
 * does), x * (1 / sqrt(mean + eps)) rounded to bfloat16, then times w rounded to bfloat16. */
void headwise_rms_rows_bf16(const bf16* x, long rows, long ldx, const bf16* w, float eps, long m,
                            bf16* y) {
    for (long i = 0; i < rows; i++) {
        const bf16* xi = x + i * ldx;
        double s = 0.0;
        for (long k = 0; k < m; k++) {
            double v = from_bf16(xi[k]);
            s += v * v;
        }
        float inv = (float)(1.0 / sqrt(s / (double)m + (double)eps));
        for (long k = 0; k < m; k++)
            y[i * m + k] = to_bf16(from_bf16(w[k]) * from_bf16(to_bf16(from_bf16(xi[k]) * inv)));
    }
}
