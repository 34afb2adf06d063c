/* Products of 1 to 4 float32 rows with a matrix held as 8-bit codes (headwise.fast.q8.Q8: a
 * GGUF's Q8_0 blocks, e.g. SmolLM2's tied embedding, its vocabulary head): y (b, out) =
 * x (b, in) @ W^T (+ bias) (+ res), where
 *   W[o, 32 g + i] = d[o, g] * q[o, 32 g + i],   q int8, d float16,
 * codes (out, in) int8 and d (out, in / 32) float16.
 *
 * Why: the head is the step's largest matrix (49152 x 576 for SmolLM2); as float32 it is 108 MiB
 * a token, as codes and scales 29 MiB. The codes are widened in registers, never into a float
 * copy, and each one is multiplied by its scale before it meets x: d * q is exact in float32
 * (11 + 8 significant bits), so every product is the float32 product of the float32 matrix the
 * same codes dequantize to (the model's own float32 head) and only the order of the float32
 * sums differs from that product's.
 *
 * Two paths (step_kernels.h), both reading one row of codes at a time front to back:
 * - AVX512: 16 codes per load (vpmovsxbd), widened to float32, times the group's scale, one FMA
 *   per row of x; two sums per row of x (the group's two halves).
 * - AVX2: the same, 8 codes per load.
 * For one row of x, STREAMS rows of W from STREAMS contiguous parts of the block per pass (as
 * step_kernels_bf16.c's one-row kernel: more sums in flight, four long streams); for 2-4 rows of
 * x, one row of W against all of them. */
#include "step_kernels.h"

#define GROUP 32
#define STREAMS 4

typedef struct {
    const int8_t* codes;
    const uint16_t* d; /* float16 bits */
    const float *x, *res, *bias;
    float* y;
    long ldc, ldd, ldx, ldy, ldr, groups;
} q8_args;

static inline void put(const q8_args* a, int b, long o, float s) {
    if (a->bias) s += a->bias[o];
    if (a->res) s += a->res[b * a->ldr + o];
    a->y[b * a->ldy + o] = s;
}

/* Rows o[0..S-1] of W against the B rows of x, one group (32 codes) per step. */
WIDE INLINE void pass_wide(const q8_args* a, const long* o, int S, int B) {
    __m512 acc[STREAMS][4][2];
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) acc[r][b][0] = acc[r][b][1] = _mm512_setzero_ps();
    for (long g = 0; g < a->groups; g++) {
        __m512 x0[4], x1[4];
        for (int b = 0; b < B; b++) {
            x0[b] = _mm512_loadu_ps(a->x + b * a->ldx + g * GROUP);
            x1[b] = _mm512_loadu_ps(a->x + b * a->ldx + g * GROUP + 16);
        }
        for (int r = 0; r < S; r++) {
            const int8_t* c = a->codes + o[r] * a->ldc + g * GROUP;
            __m512 dv = _mm512_set1_ps(_cvtsh_ss(a->d[o[r] * a->ldd + g]));
            __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i*)c))), dv);
            __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i*)(c + 16)))), dv);
            for (int b = 0; b < B; b++) {
                acc[r][b][0] = _mm512_fmadd_ps(w0, x0[b], acc[r][b][0]);
                acc[r][b][1] = _mm512_fmadd_ps(w1, x1[b], acc[r][b][1]);
            }
        }
    }
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++)
            put(a, b, o[r], _mm512_reduce_add_ps(_mm512_add_ps(acc[r][b][0], acc[r][b][1])));
}

/* The same on AVX2: 8 codes per load, four sums per row of x. */
NARROW_F16C INLINE void pass_narrow(const q8_args* a, const long* o, int S, int B) {
    __m256 acc[STREAMS][4][2];
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++) acc[r][b][0] = acc[r][b][1] = _mm256_setzero_ps();
    for (long g = 0; g < a->groups; g++) {
        for (int r = 0; r < S; r++) {
            const int8_t* c = a->codes + o[r] * a->ldc + g * GROUP;
            __m256 dv = _mm256_set1_ps(_cvtsh_ss(a->d[o[r] * a->ldd + g]));
            for (int h = 0; h < GROUP; h += 16) {
                __m128i cv = _mm_loadu_si128((const __m128i*)(c + h));
                __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(cv)), dv);
                __m256 w1 = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(cv, 8))), dv);
                for (int b = 0; b < B; b++) {
                    const float* xb = a->x + b * a->ldx + g * GROUP + h;
                    acc[r][b][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), acc[r][b][0]);
                    acc[r][b][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), acc[r][b][1]);
                }
            }
        }
    }
    for (int r = 0; r < S; r++)
        for (int b = 0; b < B; b++)
            put(a, b, o[r], sum8(_mm256_add_ps(acc[r][b][0], acc[r][b][1])));
}

/* [o0, o1) against the B rows of x: for one row, STREAMS contiguous parts, one row of each per
 * pass, then the rest one by one; for more, row by row (a constant B and S in each call). */
#define BLOCK(PASS)                                                                          \
    static void block_##PASS(const q8_args* a, int B, long o0, long o1) {                    \
        if (B == 1) {                                                                        \
            long per = (o1 - o0) / STREAMS, o[STREAMS];                                      \
            for (long i = 0; i < per; i++) {                                                 \
                for (int r = 0; r < STREAMS; r++) o[r] = o0 + r * per + i;                   \
                PASS(a, o, STREAMS, 1);                                                      \
            }                                                                                \
            for (long r = o0 + STREAMS * per; r < o1; r++) PASS(a, &r, 1, 1);                \
            return;                                                                          \
        }                                                                                    \
        for (long o = o0; o < o1; o++) switch (B) {                                          \
            case 2: PASS(a, &o, 1, 2); break;                                                \
            case 3: PASS(a, &o, 1, 3); break;                                                \
            default: PASS(a, &o, 1, 4); break;                                               \
        }                                                                                    \
    }
WIDE BLOCK(pass_wide)
NARROW_F16C BLOCK(pass_narrow)

/* Returns 0; 1 when rows is not 1..4 or in is not a multiple of 32 (nothing written). */
int headwise_q8_matmul(const float* x, long ldx, const int8_t* codes, const uint16_t* d, float* y,
                       long ldy, const float* res, long ldr, const float* bias, int rows,
                       long out, long in, int threads, int wide) {
    if (rows < 1 || rows > 4 || in % GROUP) return 1;
    q8_args a = {codes, d, x, res, bias, y, in, in / GROUP, ldx, ldy, ldr, in / GROUP};
    if (wide)
        OVER_OUTPUTS(out, block_pass_wide(&a, rows, o0, o1));
    else
        OVER_OUTPUTS(out, block_pass_narrow(&a, rows, o0, o1));
    return 0;
}
