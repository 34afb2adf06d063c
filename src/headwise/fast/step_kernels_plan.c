/* A decoding step's run of kernel calls as one call (headwise.fast.plan): what the step's
 * Python glue otherwise does in one ctypes call per product, norm and attention (~120 products,
 * ~60 norms and ~30 attentions a SmolLM2 step, each some microseconds of argument checks,
 * allocation and conversion around the arithmetic). A plan is a table of ops, WIDTH longs each:
 * the op's kind, then the arguments the Python wrapper of that kernel (headwise.fast.native)
 * passes, its checks made once when the plan was bound. Each op calls the other files' own
 * function with those arguments, so its values are theirs bit for bit. What changes from step
 * to step comes in as arguments: the position, the thread count and the instruction-set path. */
#include <math.h>
#include <string.h>

#include "step_kernels.h"

int headwise_rows_matmul(const float* x, long ldx, const float* w, long ldw, float* y, long ldy,
                         const float* res, long ldr, const float* bias, int rows, long out,
                         long in, int threads);
int headwise_rows_matmul_bf16(const bf16* x, long ldx, const bf16* w, long ldw, bf16* y,
                              long ldy, const bf16* res, long ldr, const bf16* bias, int rows,
                              long out, long in, int threads, int wide);
void headwise_row_matmul_t(const float* x, const float* wt, long ldw, float* y, const float* res,
                           const float* bias, long out, long in, int threads);
int headwise_q4_matmul(const float* x, long ldx, const uint8_t* codes, const uint16_t* d,
                       const uint16_t* m, float* y, long ldy, const float* res, long ldr,
                       const float* bias, int rows, long out, long in, int threads, int wide);
int headwise_q8_matmul(const float* x, long ldx, const int8_t* codes, const uint16_t* d, float* y,
                       long ldy, const float* res, long ldr, const float* bias, int rows,
                       long out, long in, int threads, int wide);
void headwise_rms_rows(const float* x, long rows, long ldx, const float* w, float eps, long m,
                       float* y);
void headwise_rms_rows_bf16(const bf16* x, long rows, long ldx, const bf16* w, float eps, long m,
                            bf16* y);
int headwise_self_rows(void* x, long rows, long ldx, long h, long g, long d, long r,
                       const void* cos, const void* sin, int size, void* kc, void* vc,
                       long sb, long sg, long sj, long pos, long start, int attend,
                       float scale, float* out, long ldo, int threads);

/* The kinds (headwise.fast.plan.KINDS has the same numbers) and the op's width in longs. */
enum { RMS = 1, RMS_BF16, ROWS, ROWS_BF16, ROW_T, Q4, Q8, SELF, TO_BF16, SILU_MUL };
#define WIDTH 24

#define P(i) ((void*)op[i])
#define F(i) ((float)as_double(op[i]))  /* a double's bits, rounded once as ctypes rounds */

static inline double as_double(long bits) {
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* A gated feed-forward's activation, out = silu(g) * u, as torch computes it (F.silu then
 * torch.mul), for rows of f features (f a multiple of the vector width): silu(x) = x / (1 +
 * exp(-x)) in vectors, with the vector exp torch's own kernel calls (`exp`: Sleef's, found in
 * torch's library by headwise.fast.plan, which checks the results against torch's once); in
 * bfloat16 each of silu and the product computed in float32 and rounded once, as torch's
 * bfloat16 vectors are. Returns 1 at a NaN (whose bits torch's paths spell differently: the
 * step's layer is then redone by torch). The 16-lane form where torch runs AVX-512, the 8-lane
 * one where it runs AVX2. */
typedef __m512 (*exp16_fn)(__m512);
typedef __m256 (*exp8_fn)(__m256);
typedef int (*silu_fn)(const void* g, const void* u, long at, void* out, long o, int half,
                       const void* exp);

__attribute__((target("avx512f,avx512dq,avx2,fma")))
static inline __m512 load16(const void* p, long at, int half) {
    if (!half) return _mm512_loadu_ps((const float*)p + at);
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)((const bf16*)p + at))), 16));
}

/* The 16 values of g and u at `at`, their results at `o` of out; nonzero at a NaN. */
__attribute__((target("avx512f,avx512dq,avx2,fma")))
static int silu16(const void* g, const void* u, long at, void* out, long o, int half,
                  const void* exp) {
    __m512 x = load16(g, at, half), one = _mm512_set1_ps(1.0f);
    __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, ((exp16_fn)exp)(
                                                      _mm512_xor_ps(x, _mm512_set1_ps(-0.0f)))));
    __mmask16 nan = _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q);
    if (half)
        s = _mm512_castsi512_ps(_mm512_and_si512(bf16_near16(s), _mm512_set1_epi32(~0xffff)));
    __m512 y = _mm512_mul_ps(s, load16(u, at, half));
    nan |= _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    if (half)
        _mm256_storeu_si256((__m256i*)((bf16*)out + o),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_near16(y), 16)));
    else
        _mm512_storeu_ps((float*)out + o, y);
    return nan != 0;
}

/* The same for 8 values, with torch's AVX2 exp; the rounding one value at a time. */
static int silu8(const void* g, const void* u, long at, void* out, long o, int half,
                 const void* exp) {
    float xs[8], t[8];
    for (int k = 0; k < 8; k++)
        xs[k] = half ? from_bf16(((const bf16*)g)[at + k]) : ((const float*)g)[at + k];
    __m256 x = _mm256_loadu_ps(xs);
    _mm256_storeu_ps(t, _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), ((exp8_fn)exp)(
                                                           _mm256_xor_ps(x, _mm256_set1_ps(-0.0f))))));
    int nan = 0;
    for (int k = 0; k < 8; k++) {
        float v = half ? from_bf16(((const bf16*)u)[at + k]) : ((const float*)u)[at + k];
        float y = (half ? from_bf16(to_bf16(t[k])) : t[k]) * v;
        nan |= (t[k] != t[k]) | (y != y);
        if (half)
            ((bf16*)out)[o + k] = to_bf16(y);
        else
            ((float*)out)[o + k] = y;
    }
    return nan;
}

/* One op; returns 0 when it ran as the unbound call would have succeeded. */
static int run(const long* op, long pos, int threads, int wide) {
    switch (op[0]) {
        case RMS:
            headwise_rms_rows(P(1), op[2], op[3], P(4), F(5), op[6], P(7));
            return 0;
        case RMS_BF16:
            headwise_rms_rows_bf16(P(1), op[2], op[3], P(4), F(5), op[6], P(7));
            return 0;
        case ROWS:
            return headwise_rows_matmul(P(1), op[2], P(3), op[4], P(5), op[6], P(7), op[8], P(9),
                                        (int)op[10], op[11], op[12], threads);
        case ROWS_BF16:
            return headwise_rows_matmul_bf16(P(1), op[2], P(3), op[4], P(5), op[6], P(7), op[8],
                                             P(9), (int)op[10], op[11], op[12], threads, wide);
        case ROW_T:
            headwise_row_matmul_t(P(1), P(2), op[3], P(4), P(5), P(6), op[7], op[8], threads);
            return 0;
        case Q4:
            return headwise_q4_matmul(P(1), op[2], P(3), P(4), P(5), P(6), op[7], P(8), op[9],
                                      P(10), (int)op[11], op[12], op[13], threads, wide);
        case Q8:
            return headwise_q8_matmul(P(1), op[2], P(3), P(4), P(5), op[6], P(7), op[8], P(9),
                                      (int)op[10], op[11], op[12], threads, wide);
        case SELF: {
            /* 1 rows, 2 b, 3 ldx, 4 h, 5 g, 6 d, 7 r, 8 cos, 9 sin (tables of every position,
             * 10 elements apart), 11 size, 12 k, 13 v, 14-16 strides, 17 window (0: none),
             * 18 scale, 19 out, 20 ldo. The unbound call's position-dependent arguments: the
             * angles' row, the window's start, attend (the plan runs only on finite caches). */
            long start = op[17] && pos + 1 > op[17] ? pos + 1 - op[17] : 0;
            long at = op[7] ? pos * op[10] * op[11] : 0;
            const char *cos = op[7] ? (const char*)P(8) + at : 0,
                       *sin = op[7] ? (const char*)P(9) + at : 0;
            return headwise_self_rows(P(1), op[2], op[3], op[4], op[5], op[6], op[7], cos, sin,
                                      (int)op[11], P(12), P(13), op[14], op[15], op[16], pos,
                                      start, 1, F(18), P(19), op[20], threads) != 2;
        }
        case TO_BF16: {  /* float32 -> bfloat16 as torch's .to() rounds (ties to even); a NaN
                          * (whose bits torch's paths spell differently) stops the plan */
            const float* src = P(1);
            bf16* dst = P(2);
            for (long i = 0; i < op[3]; i++) {
                if (isnan(src[i])) return 1;
                dst[i] = to_bf16(src[i]);
            }
            return 0;
        }
        case SILU_MUL: { /* 1 g, 2 u, 3 their row stride, 4 out, 5 rows, 6 f, 7 bfloat16,
                          * 8 the vector exp, 9 its lanes (16 or 8) */
            silu_fn one = op[9] == 16 ? silu16 : silu8;
            int nan = 0;
            for (long r = 0; r < op[5]; r++)
                for (long i = 0; i < op[6]; i += op[9])
                    nan |= one(P(1), P(2), r * op[3] + i, P(4), r * op[6] + i, (int)op[7], P(8));
            return nan;
        }
        default:
            return 1;
    }
}

/* Runs ops [from, to) of the table at `ops`; returns -1 when all ran, else the index of the
 * first that did not (nothing after it ran: the caller takes over from there). */
long headwise_plan_run(const long* ops, long from, long to, long pos, int threads, int wide) {
    for (long i = from; i < to; i++)
        if (run(ops + i * WIDTH, pos, threads, wide)) return i;
    return -1;
}
