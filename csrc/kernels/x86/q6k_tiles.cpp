// The Q6_K tile kernels on x86-64 (AVX2, AVX-VNNI, AVX512-VNNI) over q6k_head.cpp's packed layout;
// tiles.h hands their table to q6k_head.cpp.
#include "kernels/x86/int8_tiles.h"

#include <cstddef>
#include <cstdint>

#include "kernels/int8_rows.h"
#include "kernels/tiles.h"

#ifdef LOCALSPEC_X86

namespace localspec {

namespace {

using Job = Q6KJob;

#define LOCALSPEC_UNROLL _Pragma("GCC unroll 8")

// One group of 8 vocabulary rows against ROWS hidden rows (first_row ..); the group's weights
// stay in cache while the caller loops over tiles of hidden rows.
#define LOCALSPEC_Q6K_TILE(NAME, TARGET, DPBUSD)                                                      \
    template <int ROWS>                                                                              \
    __attribute__((target(TARGET))) void NAME(const Job& job, int64_t g, int first_row) {            \
        const int ns = job.n_super;                                                                  \
        const __m256i* w = reinterpret_cast<const __m256i*>(job.weights) + g * ns * 48;              \
        const int8_t* sc = job.scales + g * ns * 128;                                                \
        const uint16_t* dw = job.d + g * ns * 8;                                                     \
        const __m256i low4 = _mm256_set1_epi8(0x0F), high2 = _mm256_set1_epi8(0x30);                 \
        __m256 acc[ROWS];                                                                            \
        LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();                \
        for (int s = 0; s < ns; ++s) {                                                               \
            prefetch_block<1536>(w + s * 48);                                                        \
            __m256i isum[ROWS];                                                                      \
            LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) isum[r] = _mm256_setzero_si256();        \
            for (int j = 0; j < 16; ++j) {                                                           \
                /* 16-bit shifts move bits across bytes; the masks keep each byte's own. */          \
                const __m256i* wj = w + (s * 16 + j) * 3;                                            \
                const __m256i lo01 = _mm256_loadu_si256(wj), lo23 = _mm256_loadu_si256(wj + 1);      \
                const __m256i hi = _mm256_loadu_si256(wj + 2);                                       \
                const __m256i wk0 = _mm256_or_si256(_mm256_and_si256(lo01, low4),                    \
                                                    _mm256_and_si256(_mm256_slli_epi16(hi, 4), high2));  \
                const __m256i wk1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo01, 4), low4),  \
                                                    _mm256_and_si256(_mm256_slli_epi16(hi, 2), high2));  \
                const __m256i wk2 = _mm256_or_si256(_mm256_and_si256(lo23, low4),                    \
                                                    _mm256_and_si256(hi, high2));                    \
                const __m256i wk3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo23, 4), low4),  \
                                                    _mm256_and_si256(_mm256_srli_epi16(hi, 2), high2));  \
                const __m256i scale = _mm256_cvtepi8_epi32(                                          \
                    _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + (s * 16 + j) * 8)));       \
                LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {                                    \
                    const size_t rsj = (static_cast<size_t>(first_row + r) * ns + s) * 16 + j;       \
                    const int32_t* x = job.q->words.data() + rsj * 4;                                \
                    __m256i part = _mm256_set1_epi32(job.q->offset[rsj]);                            \
                    part = DPBUSD(part, wk0, _mm256_set1_epi32(x[0]));                               \
                    part = DPBUSD(part, wk1, _mm256_set1_epi32(x[1]));                               \
                    part = DPBUSD(part, wk2, _mm256_set1_epi32(x[2]));                               \
                    part = DPBUSD(part, wk3, _mm256_set1_epi32(x[3]));                               \
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(part, scale));            \
                }                                                                                    \
            }                                                                                        \
            const __m256 scale_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dw + s * 8)));  \
            LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {                                        \
                const float dx = job.q->scale[static_cast<size_t>(first_row + r) * ns + s];          \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]),                                \
                                         _mm256_mul_ps(scale_w, _mm256_set1_ps(dx)), acc[r]);        \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < ROWS; ++r) {                                                             \
            store_group(job.logits + static_cast<size_t>(first_row + r) * job.n_vocab + g * 8, acc[r],  \
                        job.n_vocab - g * 8);                                                        \
        }                                                                                            \
    }

LOCALSPEC_Q6K_TILE(tile_avxvnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32)
LOCALSPEC_Q6K_TILE(tile_avx2, "avx2,fma,f16c", dot_unsigned_avx2)
LOCALSPEC_Q6K_TILE(tile_avx512vnni, "avx2,fma,f16c,avx512vl,avx512vnni", _mm256_dpbusd_epi32)
#undef LOCALSPEC_Q6K_TILE

// Two neighbouring groups (16 vocabulary rows) in 512-bit registers, for tiles whose weights are
// in cache (run_tiles): one broadcast of x and one scale multiply per sub-block serve both
// groups. Each lane computes what tile_avx512vnni computes for its row, in the same order: the
// same bits.
template <int ROWS>
__attribute__((target(LOCALSPEC_AVX512_PAIR))) void pair_avx512vnni(const Job& job, int64_t g, int first_row) {
    const int ns = job.n_super;
    const __m256i* w0 = reinterpret_cast<const __m256i*>(job.weights) + g * ns * 48;
    const __m256i* w1 = w0 + static_cast<size_t>(ns) * 48;
    const int8_t* sc0 = job.scales + g * ns * 128;
    const int8_t* sc1 = sc0 + static_cast<size_t>(ns) * 128;
    const uint16_t* d0 = job.d + g * ns * 8;
    const uint16_t* d1 = d0 + static_cast<size_t>(ns) * 8;
    const __m512i low4 = _mm512_set1_epi8(0x0F), high2 = _mm512_set1_epi8(0x30);
    __m512 acc[ROWS];
    LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
    for (int s = 0; s < ns; ++s) {
        __m512i isum[ROWS];
        LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) isum[r] = _mm512_setzero_si512();
        for (int j = 0; j < 16; ++j) {
            const size_t at = static_cast<size_t>(s * 16 + j);
            const __m512i lo01 = pair_load(w0 + at * 3, w1 + at * 3), lo23 = pair_load(w0 + at * 3 + 1, w1 + at * 3 + 1);
            const __m512i hi = pair_load(w0 + at * 3 + 2, w1 + at * 3 + 2);
            const __m512i wk0 = _mm512_or_si512(_mm512_and_si512(lo01, low4),
                                                _mm512_and_si512(_mm512_slli_epi16(hi, 4), high2));
            const __m512i wk1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo01, 4), low4),
                                                _mm512_and_si512(_mm512_slli_epi16(hi, 2), high2));
            const __m512i wk2 = _mm512_or_si512(_mm512_and_si512(lo23, low4), _mm512_and_si512(hi, high2));
            const __m512i wk3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo23, 4), low4),
                                                _mm512_and_si512(_mm512_srli_epi16(hi, 2), high2));
            const __m512i scale = _mm512_cvtepi8_epi32(pair_bytes(sc0 + at * 8, sc1 + at * 8));
            LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {
                const size_t rsj = (static_cast<size_t>(first_row + r) * ns + s) * 16 + j;
                const int32_t* x = job.q->words.data() + rsj * 4;
                __m512i part = _mm512_set1_epi32(job.q->offset[rsj]);
                part = _mm512_dpbusd_epi32(part, wk0, _mm512_set1_epi32(x[0]));
                part = _mm512_dpbusd_epi32(part, wk1, _mm512_set1_epi32(x[1]));
                part = _mm512_dpbusd_epi32(part, wk2, _mm512_set1_epi32(x[2]));
                part = _mm512_dpbusd_epi32(part, wk3, _mm512_set1_epi32(x[3]));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(part, scale));
            }
        }
        const __m512 scale_w = pair_fp16(d0 + s * 8, d1 + s * 8);
        LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {
            const float dx = job.q->scale[static_cast<size_t>(first_row + r) * ns + s];
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(scale_w, _mm512_set1_ps(dx)), acc[r]);
        }
    }
    for (int r = 0; r < ROWS; ++r) {
        store_pair(job.logits + static_cast<size_t>(first_row + r) * job.n_vocab + g * 8, acc[r], job.n_vocab - g * 8);
    }
}
#undef LOCALSPEC_UNROLL

}  // namespace

HeadKernels<Q6KRun> q6k_kernels() {
    return LOCALSPEC_TILE_KERNELS(Q6KJob);
}

}  // namespace localspec

#endif
