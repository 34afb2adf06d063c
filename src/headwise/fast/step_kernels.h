/* What the decoding step's C kernels share (headwise.fast.native builds step_kernels.c,
 * step_kernels_bf16.c and step_kernels_q4.c into one library): the instruction-set paths, the
 * bfloat16 conversions and the split of output features over threads.
 *
 * Paths. The whole library is built for AVX2 + FMA (-mavx2 -mfma). The bfloat16 and 4-bit
 * kernels also have an AVX-512 path with AVX512-BF16's vdpbf16ps (two bfloat16 products summed
 * into a float32 lane per instruction), in functions compiled for those features alone
 * (WIDE), so the library still loads and runs on a CPU without them. Which path runs is the
 * caller's argument `wide` (1: AVX512-BF16, 0: AVX2): headwise_wide_ok says whether this CPU
 * (and its OS) has the features, and headwise.fast.native passes 0 when it does not or when
 * HEADWISE_NATIVE_ISA=avx2 forces the narrower path. */
#ifndef HEADWISE_STEP_KERNELS_H
#define HEADWISE_STEP_KERNELS_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;  /* a bfloat16's bits: the high half of a float32 */

#define INLINE static inline __attribute__((always_inline))
#define WIDE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma,avx2")))
#define NARROW_F16C __attribute__((target("avx2,fma,f16c")))

static inline float from_bf16(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bfloat16, rounded to nearest, ties to even (what torch's .to(torch.bfloat16) and
 * vcvtneps2bf16 do); a NaN stays a NaN. */
static inline bf16 to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* to_bf16's rounding of 16 lanes (to nearest, ties to even), the bfloat16 in the high half of
 * each lane; a NaN is the caller's to handle. AVX-512F alone, so kernels for CPUs without
 * AVX512-BF16 use it too. */
__attribute__((target("avx512f"))) INLINE __m512i bf16_near16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
}

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Run CALL over output features [o0, o1): all of [0, out) in this thread for one thread or a
 * small product, else one contiguous block (a multiple of 8) per OpenMP thread, over the
 * caller's variable `threads` (the pragma names it: a macro argument cannot reach it). */
#define OVER_OUTPUTS(out, CALL)                                                               \
    do {                                                                                      \
        if (threads <= 1 || (out) < 64) {                                                     \
            long o0 = 0, o1 = (out);                                                          \
            CALL;                                                                             \
        } else {                                                                              \
            _Pragma("omp parallel num_threads(threads)")                                      \
            {                                                                                 \
                long t_ = omp_get_thread_num(), n_ = omp_get_num_threads();                   \
                long per_ = (((out) + n_ - 1) / n_ + 7) & ~7L;                                \
                long o0 = t_ * per_, o1 = o0 + per_ < (out) ? o0 + per_ : (out);              \
                if (o0 < o1) CALL;                                                            \
            }                                                                                 \
        }                                                                                     \
    } while (0)

#endif
