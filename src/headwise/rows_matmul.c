/* y (b, out) = x (b, in) @ W^T (+ bias) (+ res) for 1 to 4 rows of float32, W (out, in) with
 * contiguous rows: the small-batch product of a cached decoding step (headwise._native says why
 * it exists and when it is used). AVX2 + FMA; built by headwise._native on first use.
 *
 * Each pass reads two rows of W once and multiplies them with every row of x (8 floats per
 * load, 2 * b accumulators), prefetching PREFETCH floats ahead along W so the stream keeps
 * enough reads in flight; the rows of x stay in L1. Output features are split into contiguous
 * blocks, one per OpenMP thread (the runtime torch itself loaded: libgomp.so.1). */
#include <immintrin.h>
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
