/* The self-attention of one new position per row in one call (headwise.fast.native.self_rows):
 * what the decoding step otherwise does in six or more calls (RoPE, the cache's two writes,
 * its views, the finiteness check, the attention), each ~1.5-9 us of Python and torch
 * dispatch around a few microseconds of arithmetic. It calls the other files' own functions,
 * so its values are theirs bit for bit: headwise_rope_rows(_bf16) (step_kernels.c,
 * step_kernels_bf16.c), then the cache write (a copy), then headwise_attend_rows(_bf16)
 * (step_kernels_attend.inc). */
#include <stdlib.h>
#include <string.h>

#include "step_kernels.h"

int headwise_rope_rows(float* x, long rows, long ldx, long heads, long d, long r,
                       const float* cos, const float* sin, long check);
int headwise_rope_rows_bf16(bf16* x, long rows, long ldx, long heads, long d, long r,
                            const bf16* cos, const bf16* sin, long check);
int headwise_attend_rows(const float* q, long ldq, const float* k, const float* v, long sb,
                         long sg, long sj, long rows, long h, long g, long n, long d,
                         float scale, float* out, long ldo, int threads);
int headwise_attend_rows_bf16(const float* q, long ldq, const bf16* k, const bf16* v, long sb,
                              long sg, long sj, long rows, long h, long g, long n, long d,
                              float scale, float* out, long ldo, int threads);

/* Rows x (rows, ldx apart) of a fused q|k|v projection: h query heads, then g key and g value
 * heads, d features each, element size `size` (4: float32, 2: bfloat16).
 * 1) RoPE turns the first r features of the h + g query and key heads in place (cos, sin as
 *    headwise_rope_rows takes them; r = 0: no RoPE), and every feature of the rows is checked
 *    finite;
 * 2) each row's k and v go into the cache buffers kc, vc (strides sb, sg, sj in elements) at
 *    position pos;
 * 3) only when the rows are finite and `attend` is set: the new query's attention over the
 *    positions start .. pos of the cache -> out (float32, rows ldo apart; the caller rounds
 *    it for bfloat16).
 * Returns 2 when it attended, 1 when the rows are finite but it did not attend, 0 when they
 * are not finite (the caller attends with its NaN policy), -1 when scratch memory could not
 * be had (k and v are written; nothing attended). */
int headwise_self_rows(void* x, long rows, long ldx, long h, long g, long d, long r,
                       const void* cos, const void* sin, int size, void* kc, void* vc,
                       long sb, long sg, long sj, long pos, long start, int attend,
                       float scale, float* out, long ldo, int threads) {
    long width = (h + 2 * g) * d;
    int finite;
    if (size == 4)
        finite = headwise_rope_rows((float*)x, rows, ldx, r ? h + g : 0, d, r, cos, sin, width);
    else
        finite = headwise_rope_rows_bf16((bf16*)x, rows, ldx, r ? h + g : 0, d, r, cos, sin,
                                         width);
    char *xb = x, *kb = kc, *vb = vc;
    for (long i = 0; i < rows; i++)
        for (long kv = 0; kv < g; kv++) {
            long at = (i * sb + kv * sg + pos * sj) * size;
            memcpy(kb + at, xb + (i * ldx + (h + kv) * d) * size, (size_t)(d * size));
            memcpy(vb + at, xb + (i * ldx + (h + g + kv) * d) * size, (size_t)(d * size));
        }
    if (!finite || !attend) return finite;
    long n = pos + 1 - start;
    if (size == 4)
        return headwise_attend_rows((const float*)x, ldx, (const float*)kc + start * sj,
                                    (const float*)vc + start * sj, sb, sg, sj, rows, h, g, n, d,
                                    scale, out, ldo, threads) ? -1 : 2;
    float* q = malloc(sizeof(float) * (size_t)(rows * h * d));  /* the queries as float32 */
    if (!q) return -1;
    for (long i = 0; i < rows; i++)
        for (long c = 0; c < h * d; c++) q[i * h * d + c] = from_bf16(((bf16*)x)[i * ldx + c]);
    int failed = headwise_attend_rows_bf16(q, h * d, (const bf16*)kc + start * sj,
                                           (const bf16*)vc + start * sj, sb, sg, sj, rows, h, g,
                                           n, d, scale, out, ldo, threads);
    free(q);
    return failed ? -1 : 2;
}
