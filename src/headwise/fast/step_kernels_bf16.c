/* bfloat16 products of 1 to 4 rows (headwise.fast.native says why these kernels exist):
 * y (b, out) = x (b, in) @ W^T (+ bias) (+ res), every tensor bfloat16, W (out, in) with
 * contiguous rows. Each output is one float32 sum of exact products (a bfloat16 times a
 * bfloat16 has 16 significant bits), bias and residual added in float32, then rounded to
 * bfloat16 once: what torch's bfloat16 F.linear does up to the order of the sums (torch rounds
 * the product before adding a residual; this rounds once, so it is never further from the exact
 * value).
 *
 * A decoding step reads every weight once, so these read W at the speed memory delivers it:
 * one row of W at a time against every row of x (which sits in L1), so that each thread reads
 * its block of W front to back. Reading several rows of W per pass (as the float32 kernel
 * does) keeps several short streams in flight instead: for SmolLM2's 576-wide rows (1152
 * bytes) eight such streams read ~11.5 GB/s on this project's Zen 4 where one row at a time
 * reads ~24 (and a plain sum over a buffer ~20). Two sums per row of x, so each sum waits on
 * its own chain only every other step. Two paths, picked by the caller's `wide`
 * (step_kernels.h):
 * - AVX512-BF16: vdpbf16ps takes 32 bfloat16 of W and of x and adds the 16 pair sums into
 *   float32 lanes: no widening at all; the tail of a row (in % 64) through masked loads, which
 *   read zeros past the end.
 * - AVX2: a bfloat16 is the high half of a float32, so 16 of them (one 256-bit load) widen by
 *   one shift (the even ones) and one AND (the odd ones) into two float32 vectors, which x
 *   matches by the same split; two FMAs. The tail (in % 32) one product at a time. */
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

/* Row o of W against the B rows of x, 64 weights per step in two sums per row of x. */
WIDE INLINE void row_wide(const bf16_args* a, long o, int B) {
    __m512 acc[4][2];
    for (int b = 0; b < B; b++) acc[b][0] = acc[b][1] = _mm512_setzero_ps();
    const bf16* w = a->w + o * a->ldw;
    long k = 0, n = a->n;
    for (; k + 64 <= n; k += 64) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
        for (int b = 0; b < B; b++) {
            const bf16* xb = a->x + b * a->ldx + k;
            acc[b][0] = _mm512_dpbf16_ps(acc[b][0], w0, (__m512bh)_mm512_loadu_si512(xb));
            acc[b][1] = _mm512_dpbf16_ps(acc[b][1], w1, (__m512bh)_mm512_loadu_si512(xb + 32));
        }
    }
    for (; k < n; k += 32) {  /* the last n - k < 64: masked loads give zeros past the end */
        __mmask32 m = n - k >= 32 ? ~0u : (__mmask32)((1u << (n - k)) - 1);
        __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + k);
        for (int b = 0; b < B; b++)
            acc[b][0] = _mm512_dpbf16_ps(
                acc[b][0], wv, (__m512bh)_mm512_maskz_loadu_epi16(m, a->x + b * a->ldx + k));
    }
    for (int b = 0; b < B; b++) put(a, b, o, _mm512_reduce_add_ps(_mm512_add_ps(acc[b][0], acc[b][1])));
}

WIDE static void rows_wide(const bf16_args* a, int B, long o0, long o1) {
    for (long o = o0; o < o1; o++) switch (B) {  /* a constant B in each call: unrolled */
        case 1: row_wide(a, o, 1); break;
        case 2: row_wide(a, o, 2); break;
        case 3: row_wide(a, o, 3); break;
        default: row_wide(a, o, 4); break;
    }
}

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
