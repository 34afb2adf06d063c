/* The cached decoding step's C kernels (headwise.fast.native says why they exist and when they are
 * used; AVX2 + FMA, built by headwise.fast.native on first use): here the float32 ones,
 * headwise_rows_matmul, headwise_row_matmul_t, headwise_rope_rows, headwise_rms_rows,
 * headwise_attend_rows, and the CPU-feature test headwise_features; the bfloat16 products in
 * step_kernels_bf16.c, the 4-bit ones in step_kernels_q4.c (paths: step_kernels.h).
 *
 * headwise_rows_matmul: y (b, out) = x (b, in) @ W^T (+ bias) (+ res) for 1 to 4 rows, W (out,
 * in) with contiguous rows: the small-batch product. Each pass reads a few rows of W once (eight
 * for one row of x, two for 2-4) and multiplies them with every row of x (8 floats per load),
 * prefetching PREFETCH floats ahead along W at 2-4 rows so the stream keeps enough reads in
 * flight; the rows of x stay in L1.
 * headwise_row_matmul_t: the same product for one row with W stored as W^T (in, out): y is
 * accumulated in place, eight rows of W^T per pass (y += x[k..k+7] . W^T[k..k+7, :]), so the
 * weights stream once, front to back, while y stays in cache.
 * Both split output features into contiguous blocks, one per OpenMP thread (the runtime torch
 * itself loaded: libgomp.so.1). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "step_kernels.h"

#define PREFETCH 4608

/* What this CPU (and its OS, which must save the registers) runs: bit 0: F16C (the 4-bit
 * kernels' float16 scales), bit 1: the AVX512-BF16 path of step_kernels.h's WIDE functions. */
int headwise_features(void) {
    __builtin_cpu_init();
    int f16c = __builtin_cpu_supports("f16c") != 0;
    int wide = f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
               && __builtin_cpu_supports("avx512bf16");
    return f16c | (wide << 1);
}

#define total sum8  /* (step_kernels.h) */

static inline float finish(float s, const float* w, const float* xb, long k, long n,
                           const float* bias, const float* res, long o) {
    for (; k < n; k++) s += w[k] * xb[k];
    if (bias) s += bias[o];
    if (res) s += res[o];
    return s;
}

#define ROWS(B)                                                                                \
static void rows##B(const float* x, long ldx, const float* w, long ldw, float* y, long ldy,    \
                    const float* res, long ldr, const float* bias, long o0, long o1, long n) { \
    long o = o0;                                                                               \
    for (; o + 1 < o1; o += 2) {                                                               \
        const float* w0 = w + o * ldw;                                                         \
        const float* w1 = w0 + ldw;                                                            \
        __m256 a0[B], a1[B];                                                                   \
        for (int b = 0; b < B; b++) a0[b] = a1[b] = _mm256_setzero_ps();                       \
        long k = 0;                                                                            \
        for (; k + 8 <= n; k += 8) {                                                           \
            _mm_prefetch((const char*)(w0 + k + PREFETCH), _MM_HINT_T0);                       \
            _mm_prefetch((const char*)(w1 + k + PREFETCH), _MM_HINT_T0);                       \
            __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);                 \
            for (int b = 0; b < B; b++) {                                                      \
                __m256 xv = _mm256_loadu_ps(x + b * ldx + k);                                  \
                a0[b] = _mm256_fmadd_ps(v0, xv, a0[b]);                                        \
                a1[b] = _mm256_fmadd_ps(v1, xv, a1[b]);                                        \
            }                                                                                  \
        }                                                                                      \
        for (int b = 0; b < B; b++) {                                                          \
            const float* xb = x + b * ldx;                                                     \
            const float* rb = res ? res + b * ldr : 0;                                         \
            y[b * ldy + o] = finish(total(a0[b]), w0, xb, k, n, bias, rb, o);                  \
            y[b * ldy + o + 1] = finish(total(a1[b]), w1, xb, k, n, bias, rb, o + 1);          \
        }                                                                                      \
    }                                                                                          \
    for (; o < o1; o++) {                                                                      \
        const float* w0 = w + o * ldw;                                                         \
        for (int b = 0; b < B; b++) {                                                          \
            __m256 a = _mm256_setzero_ps();                                                    \
            long k = 0;                                                                        \
            for (; k + 8 <= n; k += 8)                                                         \
                a = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(x + b * ldx + k), a); \
            y[b * ldy + o] = finish(total(a), w0, x + b * ldx, k, n, bias,                     \
                                    res ? res + b * ldr : 0, o);                               \
        }                                                                                      \
    }                                                                                          \
}

ROWS(1)
ROWS(2)
ROWS(3)
ROWS(4)

/* One row of x: eight rows of W per pass, two accumulators each (the 16 floats of x in two
 * registers); the last rows go through rows1's pairs. */
static void row8(const float* x, long ldx, const float* w, long ldw, float* y, long ldy,
                 const float* res, long ldr, const float* bias, long o0, long o1, long n) {
    long o = o0;
    for (; o + 8 <= o1; o += 8) {
        __m256 a[8][2];
        for (int r = 0; r < 8; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
        long k = 0;
        for (; k + 16 <= n; k += 16) {
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
            for (int r = 0; r < 8; r++) {
                const float* wr = w + (o + r) * ldw + k;
                a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(wr), x0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(wr + 8), x1, a[r][1]);
            }
        }
        for (int r = 0; r < 8; r++)
            y[o + r] = finish(total(_mm256_add_ps(a[r][0], a[r][1])), w + (o + r) * ldw, x, k, n,
                              bias, res, o + r);
    }
    if (o < o1) rows1(x, ldx, w, ldw, y, ldy, res, ldr, bias, o, o1, n);
}

typedef void (*rows_fn)(const float*, long, const float*, long, float*, long, const float*,
                        long, const float*, long, long, long);

/* Returns 0, or 1 when rows is not 1..4 (nothing written). */
int headwise_rows_matmul(const float* x, long ldx, const float* w, long ldw, float* y, long ldy,
                         const float* res, long ldr, const float* bias, int rows, long out,
                         long in, int threads) {
    static const rows_fn by_rows[5] = {0, row8, rows2, rows3, rows4};
    if (rows < 1 || rows > 4) return 1;
    rows_fn f = by_rows[rows];
    if (threads <= 1 || out < 64) {
        f(x, ldx, w, ldw, y, ldy, res, ldr, bias, 0, out, in);
        return 0;
    }
    #pragma omp parallel num_threads(threads)
    {
        long t = omp_get_thread_num(), n = omp_get_num_threads();
        long per = ((out + n - 1) / n + 7) & ~7L;
        long o0 = t * per, o1 = o0 + per < out ? o0 + per : out;
        if (o0 < o1) f(x, ldx, w, ldw, y, ldy, res, ldr, bias, o0, o1, in);
    }
    return 0;
}

/* y[0, out) = x @ W^T[:, 0, out) with W^T's rows ldw apart, eight rows of W^T per pass, then
 * + bias + res. */
static void cols(const float* x, const float* wt, long ldw, float* y, const float* res,
                 const float* bias, long out, long n) {
    for (long o = 0; o < out; o++) y[o] = 0.0f;
    long k = 0;
    for (; k + 8 <= n; k += 8) {
        const float* w = wt + k * ldw;
        __m256 b[8];
        for (int i = 0; i < 8; i++) b[i] = _mm256_set1_ps(x[k + i]);
        long o = 0;
        for (; o + 8 <= out; o += 8) {  /* two chains of four, then one add into y */
            const float* p = w + o;
            __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(p), b[0]);
            __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(p + ldw), b[1]);
            for (int i = 2; i < 8; i += 2) {
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(p + i * ldw), b[i], s0);
                s1 = _mm256_fmadd_ps(_mm256_loadu_ps(p + (i + 1) * ldw), b[i + 1], s1);
            }
            _mm256_storeu_ps(y + o, _mm256_add_ps(_mm256_loadu_ps(y + o), _mm256_add_ps(s0, s1)));
        }
        for (; o < out; o++) {
            float s = 0.0f;
            for (int i = 0; i < 8; i++) s += w[i * ldw + o] * x[k + i];
            y[o] += s;
        }
    }
    for (; k < n; k++)
        for (long o = 0; o < out; o++) y[o] += wt[k * ldw + o] * x[k];
    if (bias) for (long o = 0; o < out; o++) y[o] += bias[o];
    if (res) for (long o = 0; o < out; o++) y[o] += res[o];
}

void headwise_row_matmul_t(const float* x, const float* wt, long ldw, float* y, const float* res,
                           const float* bias, long out, long in, int threads) {
    if (threads <= 1 || out < 64) {
        cols(x, wt, ldw, y, res, bias, out, in);
        return;
    }
    #pragma omp parallel num_threads(threads)
    {
        long t = omp_get_thread_num(), n = omp_get_num_threads();
        long per = ((out + n - 1) / n + 7) & ~7L;
        long o0 = t * per, o1 = o0 + per < out ? o0 + per : out;
        if (o0 < o1)
            cols(x, wt + o0, ldw, y + o0, res ? res + o0 : 0, bias ? bias + o0 : 0, o1 - o0, in);
    }
}

/* RoPE on rows of a fused q|k|v projection, in place: for each of `rows` rows (row stride
 * ldx), each of the first `heads` heads of d features has its first r features turned as
 * halves (a, b) -> (a * cos0 + b * sin0, b * cos1 + a * sin1), with cos and sin the (2, r/2)
 * tables of headwise.rope (signs folded in). Each product and sum is rounded on its own (the
 * file is built with -ffp-contract=off): bit for bit torch's mul, mul, add. Returns 1 when the
 * first `check` features of every row are finite afterwards, else 0. */
int headwise_rope_rows(float* x, long rows, long ldx, long heads, long d, long r,
                       const float* cos, const float* sin, long check) {
    long half = r / 2;
    int finite = 1;
    for (long i = 0; i < rows; i++) {
        float* row = x + i * ldx;
        for (long h = 0; h < heads; h++) {
            float* a = row + h * d;
            float* b = a + half;
            for (long k = 0; k < half; k++) {
                float ta = a[k] * cos[k], tb = b[k] * sin[k];
                float ua = b[k] * cos[half + k], ub = a[k] * sin[half + k];
                a[k] = ta + tb;
                b[k] = ua + ub;
            }
        }
        for (long k = 0; k < check; k++)
            finite &= (row[k] - row[k]) == 0.0f;  /* NaN or inf: not 0 */
    }
    return finite;
}

/* RMSNorm of rows: y = x * (1 / sqrt(mean(x^2) + eps)) * w, the mean accumulated in double. */
void headwise_rms_rows(const float* x, long rows, long ldx, const float* w, float eps, long m,
                       float* y) {
    for (long i = 0; i < rows; i++) {
        const float* xi = x + i * ldx;
        double s = 0.0;
        for (long k = 0; k < m; k++) s += (double)xi[k] * xi[k];
        float inv = (float)(1.0 / sqrt(s / (double)m + (double)eps));
        for (long k = 0; k < m; k++) y[i * m + k] = xi[k] * inv * w[k];
    }
}

/* e^x for x <= 0 (scores minus their row maximum), eight at a time: x = n ln2 + r with |r| <=
 * ln2 / 2, e^r by a degree-6 polynomial (Cephes' expf coefficients), 2^n put into the exponent
 * bits; about 1 ulp. Below -87.3 the result is 0 (e^x is below float32's normal range). */
static inline __m256 exp_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 zero = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* s (n scores) -> e^(s - max s) in place; returns their sum. */
static float exps(float* s, long n) {
    /* the max eight lanes at a time (the scores are finite: the same m as one at a time) */
    __m256 mv = _mm256_set1_ps(s[0]);
    long j = 0;
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (; j < n; j++) m = s[j] > m ? s[j] : m;
    mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float z = total(sum);
    for (; j < n; j++) {  /* the tail through the same vector exp, one lane used */
        s[j] = _mm256_cvtss_f32(exp_neg(_mm256_set1_ps(s[j] - m)));
        z += s[j];
    }
    return z;
}

/* The attention over a float32 cache: headwise_attend_rows, and over a bfloat16 one:
 * headwise_attend_rows_bf16 (its keys and values widened to float32 as they are read: a
 * bfloat16 is the high half of a float32; torch's bfloat16 attention of one query costs
 * ~5x the float32 one here). */
#define KV float
#define NAME(f) f
#define LOAD8(p) _mm256_loadu_ps(p)
#define LOAD1(p) (*(p))
#include "step_kernels_attend.inc"
#undef KV
#undef NAME
#undef LOAD8
#undef LOAD1

#define KV bf16
#define NAME(f) f##_bf16
#define LOAD8(p) _mm256_castsi256_ps(_mm256_slli_epi32( \
    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p))), 16))
#define LOAD1(p) from_bf16(*(p))
#include "step_kernels_attend.inc"
