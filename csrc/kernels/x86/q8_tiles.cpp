// The Q8_0 tile kernels on x86-64 (AVX2, AVX-VNNI, AVX512-VNNI) over q8_head.cpp's packed layout;
// tiles.h hands their table to q8_head.cpp.
#include "kernels/x86/int8_tiles.h"

#include <cstddef>
#include <cstdint>

#include "kernels/int8_rows.h"
#include "kernels/tiles.h"

#ifdef LOCALSPEC_X86

namespace localspec {

namespace {

using Job = Q8Job;

// acc + the sums of 4 products of signed bytes w and x per 32-bit lane, exactly: |x| (at most
// 127: Q8_0 never gives -128) times w * sign(x) (-128..127) keeps every pair's sum in 16 bits.
__attribute__((target("avx2"))) inline __m256i dot_signed_avx2(__m256i acc, __m256i w, __m256i x) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// Registers, not memory: the accumulators and weight vectors must be fully unrolled.
#define LOCALSPEC_UNROLL _Pragma("GCC unroll 8")

// One group of 8 vocabulary rows against ROWS hidden rows (first_row ..). The weights of the
// group stay in cache while the caller loops over tiles of hidden rows. A block's 8
// multiply-adds into one sum are a chain of dependent instructions; with few rows the sum is
// split into CHAINS independent partial sums so that the chains overlap.
#define LOCALSPEC_Q8_TILE(NAME, TARGET, DPBUSD, WEIGHTS, START)                                     \
    template <int ROWS>                                                                              \
    __attribute__((target(TARGET))) void NAME(const Job& job, int64_t g, int first_row) {            \
        const int nb = job.n_blocks;                                                                 \
        const __m256i* w = reinterpret_cast<const __m256i*>(job.weights) + g * nb * 8;               \
        const uint16_t* dw = job.scales + g * nb * 8;                                                \
        __m256 acc[ROWS];                                                                            \
        LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) acc[j] = _mm256_setzero_ps();                \
        constexpr int CHAINS = ROWS >= 4 ? 1 : ROWS >= 2 ? 2 : 4;                                    \
        for (int b = 0; b < nb; ++b) {                                                               \
            prefetch_block<256>(w + b * 8);                                                          \
            __m256i wk[8];                                                                           \
            LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) wk[k] = WEIGHTS(_mm256_loadu_si256(w + b * 8 + k));  \
            const __m256 scale_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dw + b * 8)));  \
            LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) {                                        \
                const size_t jb = static_cast<size_t>(first_row + j) * nb + b;                       \
                const int32_t* x = job.q->words.data() + jb * 8;                                     \
                __m256i part[CHAINS];                                                                \
                part[0] = START(job.q->offset[jb]);                                                  \
                LOCALSPEC_UNROLL for (int c = 1; c < CHAINS; ++c) part[c] = _mm256_setzero_si256();  \
                LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) {                                       \
                    part[k % CHAINS] = DPBUSD(part[k % CHAINS], wk[k], _mm256_set1_epi32(x[k]));     \
                }                                                                                    \
                __m256i isum = part[0];                                                              \
                LOCALSPEC_UNROLL for (int c = 1; c < CHAINS; ++c) isum = _mm256_add_epi32(isum, part[c]);  \
                const __m256 scale = _mm256_mul_ps(scale_w, _mm256_set1_ps(job.q->scale[jb]));       \
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[j]);                   \
            }                                                                                        \
        }                                                                                            \
        for (int j = 0; j < ROWS; ++j) {                                                             \
            store_group(job.logits + static_cast<size_t>(first_row + j) * job.n_vocab + g * 8, acc[j],  \
                        job.n_vocab - g * 8);                                                        \
        }                                                                                            \
    }

// VNNI multiplies the stored unsigned bytes (w + 128) by x's signed bytes; `offset` removes the
// excess. AVX2 has no such instruction whose sums cannot overflow 16 bits, so its kernel turns
// the bytes back into signed w and multiplies |x| by w * sign(x) (ggml's own way): every
// partial sum fits, the block sums are the same integers, and no offset is needed.
#define LOCALSPEC_VNNI_WEIGHTS(v) (v)
#define LOCALSPEC_VNNI_START(offset) _mm256_set1_epi32(offset)
LOCALSPEC_Q8_TILE(tile_avxvnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32, LOCALSPEC_VNNI_WEIGHTS,
                  LOCALSPEC_VNNI_START)
LOCALSPEC_Q8_TILE(tile_avx512vnni, "avx2,fma,f16c,avx512vl,avx512vnni", _mm256_dpbusd_epi32,
                  LOCALSPEC_VNNI_WEIGHTS, LOCALSPEC_VNNI_START)
#define LOCALSPEC_AVX2_WEIGHTS(v) _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)))
#define LOCALSPEC_AVX2_START(offset) ((void)(offset), _mm256_setzero_si256())
LOCALSPEC_Q8_TILE(tile_avx2_signed, "avx2,fma,f16c", dot_signed_avx2, LOCALSPEC_AVX2_WEIGHTS, LOCALSPEC_AVX2_START)

// Weights within [-16, 15] (Q5_0 and Q4_0 widened), stored as w + 128: u = w + 16 is a byte of
// 0..31 that AVX2's unsigned-by-signed multiply-add takes as it is, with no sign trick (two
// fewer instructions per product vector, ~1.4x on Zen 3). Each of its pair sums is at most
// 2 * 31 * 127 = 7874, so half a block's four add exactly in 16 bits (31496); -16 * sum(x)
// (offset / 8) removes the excess. The block sums are the same integers as tile_avx2_signed's,
// then the same float operations: the same bits.
template <int ROWS>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2_small(const Job& job, int64_t g, int first_row) {
    const int nb = job.n_blocks;
    const __m256i* w = reinterpret_cast<const __m256i*>(job.weights) + g * nb * 8;
    const uint16_t* dw = job.scales + g * nb * 8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS];
    LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) acc[j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m256i wk[8];
        LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) wk[k] = _mm256_sub_epi8(_mm256_loadu_si256(w + b * 8 + k), _mm256_set1_epi8(112));
        const __m256 scale_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dw + b * 8)));
        LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) {
            const size_t jb = static_cast<size_t>(first_row + j) * nb + b;
            const int32_t* x = job.q->words.data() + jb * 8;
            __m256i half[2];
            LOCALSPEC_UNROLL for (int h = 0; h < 2; ++h) {
                half[h] = _mm256_maddubs_epi16(wk[4 * h], _mm256_set1_epi32(x[4 * h]));
                LOCALSPEC_UNROLL for (int k = 4 * h + 1; k < 4 * h + 4; ++k) {
                    half[h] = _mm256_add_epi16(half[h], _mm256_maddubs_epi16(wk[k], _mm256_set1_epi32(x[k])));
                }
            }
            const __m256i isum = _mm256_add_epi32(
                _mm256_set1_epi32(job.q->offset[jb] / 8),
                _mm256_add_epi32(_mm256_madd_epi16(half[0], ones), _mm256_madd_epi16(half[1], ones)));
            const __m256 scale = _mm256_mul_ps(scale_w, _mm256_set1_ps(job.q->scale[jb]));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[j]);
        }
    }
    for (int j = 0; j < ROWS; ++j) {
        store_group(job.logits + static_cast<size_t>(first_row + j) * job.n_vocab + g * 8, acc[j], job.n_vocab - g * 8);
    }
}

template <int ROWS>
void tile_avx2(const Job& job, int64_t g, int first_row) {
    if (job.small) {
        tile_avx2_small<ROWS>(job, g, first_row);
    } else {
        tile_avx2_signed<ROWS>(job, g, first_row);
    }
}

// Two neighbouring groups (16 vocabulary rows) in AVX-512's 512-bit registers: one broadcast of
// a hidden row's 4 bytes, one scale multiply and one float multiply-add serve both groups. With
// the weights in cache the 256-bit tile is bound by those loads and instructions around its
// multiply-adds, not by the multiply-adds themselves (Zen 4 runs two 256-bit or one 512-bit per
// cycle). Each lane computes what tile_avx512vnni computes for its row, in the same order: the
// same bits.
template <int ROWS>
__attribute__((target(LOCALSPEC_AVX512_PAIR))) void pair_avx512vnni(const Job& job, int64_t g, int first_row) {
    const int nb = job.n_blocks;
    const __m256i* w0 = reinterpret_cast<const __m256i*>(job.weights) + g * nb * 8;
    const __m256i* w1 = w0 + static_cast<size_t>(nb) * 8;
    const uint16_t* d0 = job.scales + g * nb * 8;
    const uint16_t* d1 = d0 + static_cast<size_t>(nb) * 8;
    __m512 acc[ROWS];
    LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) acc[j] = _mm512_setzero_ps();
    constexpr int CHAINS = ROWS >= 4 ? 1 : ROWS >= 2 ? 2 : 4;
    for (int b = 0; b < nb; ++b) {
        __m512i wk[8];
        LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) wk[k] = pair_load(w0 + b * 8 + k, w1 + b * 8 + k);
        const __m512 scale_w = pair_fp16(d0 + b * 8, d1 + b * 8);
        LOCALSPEC_UNROLL for (int j = 0; j < ROWS; ++j) {
            const size_t jb = static_cast<size_t>(first_row + j) * nb + b;
            const int32_t* x = job.q->words.data() + jb * 8;
            __m512i part[CHAINS];
            part[0] = _mm512_set1_epi32(job.q->offset[jb]);
            LOCALSPEC_UNROLL for (int c = 1; c < CHAINS; ++c) part[c] = _mm512_setzero_si512();
            LOCALSPEC_UNROLL for (int k = 0; k < 8; ++k) {
                part[k % CHAINS] = _mm512_dpbusd_epi32(part[k % CHAINS], wk[k], _mm512_set1_epi32(x[k]));
            }
            __m512i isum = part[0];
            LOCALSPEC_UNROLL for (int c = 1; c < CHAINS; ++c) isum = _mm512_add_epi32(isum, part[c]);
            const __m512 scale = _mm512_mul_ps(scale_w, _mm512_set1_ps(job.q->scale[jb]));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[j]);
        }
    }
    for (int j = 0; j < ROWS; ++j) {
        store_pair(job.logits + static_cast<size_t>(first_row + j) * job.n_vocab + g * 8, acc[j], job.n_vocab - g * 8);
    }
}

#undef LOCALSPEC_VNNI_WEIGHTS
#undef LOCALSPEC_VNNI_START
#undef LOCALSPEC_AVX2_WEIGHTS
#undef LOCALSPEC_AVX2_START
#undef LOCALSPEC_Q8_TILE
#undef LOCALSPEC_UNROLL

}  // namespace

// Tiles of up to 8 hidden rows with AVX-512's 32 vector registers (8 weight vectors and one
// accumulator per row), 4 with AVX2's 16: each group's weights are read once for a whole
// typical verification batch.
HeadKernels<Q8Run> q8_kernels() {
    return LOCALSPEC_TILE_KERNELS(Q8Job);
}

}  // namespace localspec

#endif
