/* The cached decoding step's C kernels (headwise._native says why they exist and when they are
 * used; AVX2 + FMA, built by headwise._native on first use, float32 throughout):
 * headwise_rows_matmul, headwise_rope_rows, headwise_rms_rows.
 *
 * headwise_rows_matmul: y (b, out) = x (b, in) @ W^T (+ bias) (+ res) for 1 to 4 rows, W (out,
 * in) with contiguous rows: the small-batch product.
 * Each pass reads two rows of W once and multiplies them with every row of x (8 floats per
 * load, 2 * b accumulators), prefetching PREFETCH floats ahead along W so the stream keeps
 * enough reads in flight; the rows of x stay in L1. Output features are split into contiguous
 * blocks, one per OpenMP thread (the runtime torch itself loaded: libgomp.so.1). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>

#define PREFETCH 4608

static inline float total(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

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

typedef void (*rows_fn)(const float*, long, const float*, long, float*, long, const float*,
                        long, const float*, long, long, long);

/* Returns 0, or 1 when rows is not 1..4 (nothing written). */
int headwise_rows_matmul(const float* x, long ldx, const float* w, long ldw, float* y, long ldy,
                         const float* res, long ldr, const float* bias, int rows, long out,
                         long in, int threads) {
    static const rows_fn by_rows[5] = {0, rows1, rows2, rows3, rows4};
    if (rows < 1 || rows > 4) return 1;
    rows_fn f = by_rows[rows];
    if (threads <= 1 || out < 64) {
        f(x, ldx, w, ldw, y, ldy, res, ldr, bias, 0, out, in);
        return 0;
    }
    #pragma omp parallel num_threads(threads)
    {
        long t = omp_get_thread_num(), n = omp_get_num_threads();
        long per = ((out + n - 1) / n + 1) & ~1L;
        long o0 = t * per, o1 = o0 + per < out ? o0 + per : out;
        if (o0 < o1) f(x, ldx, w, ldw, y, ldy, res, ldr, bias, o0, o1, in);
    }
    return 0;
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
