// The Q4_K tile kernels on x86-64 (AVX2, AVX-VNNI, AVX512-VNNI) over q4k_matmul.cpp's packed layout;
// tiles.h hands their table to q4k_matmul.cpp.
#include "kernels/x86/int8_tiles.h"

#include <cstddef>
#include <cstdint>

#include "kernels/int8_rows.h"
#include "kernels/tiles.h"

#ifdef LOCALSPEC_X86

namespace localspec {

namespace {

using Job = Q4KJob;
using namespace q4k_layout;  // kValues, kSc, kMin, kD, kDmin, kPackedBlock (tiles.h)

#define LOCALSPEC_UNROLL _Pragma("GCC unroll 8")

// One group of 8 output rows against ROWS activation rows (first_row ..). As in the Q8_0
// kernel, with few rows a sub-block's 8 multiply-adds are split into independent chains.
#define LOCALSPEC_Q4K_TILE(NAME, TARGET, DPBUSD)                                                        \
    template <int ROWS>                                                                                 \
    __attribute__((target(TARGET))) void NAME(const Job& job, int64_t g, int first_row) {               \
        const int nsb = job.n_superblocks, nb = nsb * 8;                                                \
        const uint8_t* group = job.packed + static_cast<size_t>(g) * nsb * kPackedBlock;                \
        const __m256i low = _mm256_set1_epi8(0x0F);                                                     \
        constexpr int CHAINS = ROWS >= 4 ? 1 : ROWS >= 2 ? 2 : 4;                                       \
        __m256 acc[ROWS];                                                                               \
        LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) acc[j] = _mm256_setzero_ps();                   \
        for (int b = 0; b < nsb; ++b) {                                                                 \
            const uint8_t* p = group + static_cast<size_t>(b) * kPackedBlock;                           \
            prefetch_block<kPackedBlock>(p);                                                            \
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kD)));  \
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kDmin)));  \
            /* vector (c, k) holds sub-block 2c in its low nibbles and 2c + 1 in its high ones: */     \
            /* loaded once for both */                                                                 \
            for (int c = 0; c < 4; ++c) {                                                               \
                const __m256i* v = reinterpret_cast<const __m256i*>(p + kValues) + c * 8;                \
                __m256i w[2][8];                                                                        \
                LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) {                                          \
                    const __m256i raw = _mm256_loadu_si256(v + k);                                      \
                    w[0][k] = _mm256_and_si256(raw, low);                                               \
                    w[1][k] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);                         \
                }                                                                                       \
                LOCALSPEC_UNROLL for (int h = 0; h < 2; ++h) {                                          \
                    const int s = 2 * c + h;                                                            \
                    const __m256 a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(            \
                                                          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kSc + s * 8)))));  \
                    const __m256 m = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(         \
                                                          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kMin + s * 8)))));  \
                    LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) {                                   \
                        const size_t xb = static_cast<size_t>(first_row + j) * nb + b * 8 + s;           \
                        const int32_t* x = job.q->words.data() + xb * 8;                                 \
                        __m256i part[CHAINS];                                                           \
                        LOCALSPEC_UNROLL for (int i = 0; i < CHAINS; ++i) part[i] = _mm256_setzero_si256();  \
                        LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) {                                  \
                            part[k % CHAINS] = DPBUSD(part[k % CHAINS], w[h][k], _mm256_set1_epi32(x[k]));  \
                        }                                                                               \
                        __m256i isum = part[0];                                                         \
                        LOCALSPEC_UNROLL for (int i = 1; i < CHAINS; ++i) isum = _mm256_add_epi32(isum, part[i]);  \
                        const __m256 t = _mm256_fmsub_ps(_mm256_cvtepi32_ps(isum), a,                   \
                                                         _mm256_mul_ps(m, _mm256_set1_ps(job.q->sum[xb])));  \
                        acc[j] = _mm256_fmadd_ps(t, _mm256_set1_ps(job.q->scale[xb]), acc[j]);           \
                    }                                                                                   \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
        for (int j = 0; j < ROWS; ++j) {                                                                \
            store_group(job.out + static_cast<size_t>(first_row + j) * job.n_vocab + g * 8, acc[j],    \
                        job.n_vocab - g * 8);                                                           \
        }                                                                                               \
    }

LOCALSPEC_Q4K_TILE(tile_avx512vnni, "avx2,fma,f16c,avx512vl,avx512vnni", _mm256_dpbusd_epi32)
LOCALSPEC_Q4K_TILE(tile_avxvnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32)
LOCALSPEC_Q4K_TILE(tile_avx2, "avx2,fma,f16c", dot_unsigned_avx2)
#undef LOCALSPEC_Q4K_TILE

// Two groups' 8 unsigned bytes as 16 floats.
__attribute__((target(LOCALSPEC_AVX512_PAIR))) inline __m512 pair_u8(const uint8_t* a, const uint8_t* b) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(pair_bytes(a, b)));
}

// Two neighbouring groups (16 output rows) in 512-bit registers, for tiles whose weights are in
// cache (run_tiles): as in the Q8_0 kernel, one broadcast of x and one set of float operations
// per sub-block serve both groups. Each lane computes what tile_avx512vnni computes for its row,
// in the same order: the same bits.
template <int ROWS>
__attribute__((target(LOCALSPEC_AVX512_PAIR))) void pair_avx512vnni(const Job& job, int64_t g, int first_row) {
    const int nsb = job.n_superblocks, nb = nsb * 8;
    const uint8_t* group0 = job.packed + static_cast<size_t>(g) * nsb * kPackedBlock;
    const uint8_t* group1 = group0 + static_cast<size_t>(nsb) * kPackedBlock;
    const __m512i low = _mm512_set1_epi8(0x0F);
    constexpr int CHAINS = ROWS >= 4 ? 1 : ROWS >= 2 ? 2 : 4;
    __m512 acc[ROWS];
    LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < nsb; ++b) {
        const uint8_t* p0 = group0 + static_cast<size_t>(b) * kPackedBlock;
        const uint8_t* p1 = group1 + static_cast<size_t>(b) * kPackedBlock;
        const __m512 d = pair_fp16(p0 + kD, p1 + kD);
        const __m512 dmin = pair_fp16(p0 + kDmin, p1 + kDmin);
        for (int s = 0; s < 8; ++s) {
            const __m256i* v0 = reinterpret_cast<const __m256i*>(p0 + kValues) + (s / 2) * 8;
            const __m256i* v1 = reinterpret_cast<const __m256i*>(p1 + kValues) + (s / 2) * 8;
            const __m128i shift = _mm_cvtsi32_si128((s & 1) * 4);
            __m512i w[8];
            LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) {
                w[k] = _mm512_and_si512(_mm512_srl_epi16(pair_load(v0 + k, v1 + k), shift), low);
            }
            const __m512 a = _mm512_mul_ps(d, pair_u8(p0 + kSc + s * 8, p1 + kSc + s * 8));
            const __m512 m = _mm512_mul_ps(dmin, pair_u8(p0 + kMin + s * 8, p1 + kMin + s * 8));
            LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) {
                const size_t xb = static_cast<size_t>(first_row + j) * nb + b * 8 + s;
                const int32_t* x = job.q->words.data() + xb * 8;
                __m512i part[CHAINS];
                LOCALSPEC_UNROLL for (int c = 0; c < CHAINS; ++c) part[c] = _mm512_setzero_si512();
                LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) {
                    part[k % CHAINS] = _mm512_dpbusd_epi32(part[k % CHAINS], w[k], _mm512_set1_epi32(x[k]));
                }
                __m512i isum = part[0];
                LOCALSPEC_UNROLL for (int c = 1; c < CHAINS; ++c) isum = _mm512_add_epi32(isum, part[c]);
                const __m512 t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(isum), a,
                                                 _mm512_mul_ps(m, _mm512_set1_ps(job.q->sum[xb])));
                acc[j] = _mm512_fmadd_ps(t, _mm512_set1_ps(job.q->scale[xb]), acc[j]);
            }
        }
    }
    for (int j = 0; j < ROWS; ++j) {
        store_pair(job.out + static_cast<size_t>(first_row + j) * job.n_vocab + g * 8, acc[j], job.n_vocab - g * 8);
    }
}
#undef LOCALSPEC_UNROLL

}  // namespace

HeadKernels<Q4KRun> q4k_kernels() {
    return LOCALSPEC_TILE_KERNELS(Q4KJob);
}

}  // namespace localspec

#endif
