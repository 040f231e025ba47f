// What localspec's x86 int8 kernels share (q8_tiles.cpp, q6k_tiles.cpp, q4k_tiles.cpp): storing a
// tile's outputs, AVX2's stand-in for VNNI's unsigned-by-signed multiply-add, and the registry
// of a kernel's tile sizes per instruction set. Each function names the instruction sets it
// needs (__attribute__((target(...)))), so the files build with the project's flags and
// HeadKernels::pick hands out only what this CPU runs (head_kernel_names()).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/head_common.h"
#include "kernels/tiles.h"  // LOCALSPEC_X86

#ifdef LOCALSPEC_X86
#include <immintrin.h>

namespace localspec {

// The 8 outputs of one group (out[0..8)), or the first `valid` of them in the last group.
__attribute__((target("avx"))) inline void store_group(float* out, __m256 acc, int64_t valid) {
    if (valid >= 8) {
        _mm256_storeu_ps(out, acc);
        return;
    }
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, acc);
    std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(std::max<int64_t>(valid, 0)));
}

// Asks for the bytes of the weight block kPrefetchAhead bytes past `block` (a block of BYTES
// bytes; a whole number of blocks ahead) into L2. The weights are read once per pass, in order:
// prefetching them into L2 ~16 KB ahead let one core's kernel read at its streaming bandwidth
// (Q4_K one row: 13 GB/s with L1 prefetches 4 blocks ahead, 20 GB/s so, 20-22 GB/s a plain read;
// docs/measurements/real-pair.md). A prefetch past the buffer's end is harmless.
constexpr size_t kPrefetchAhead = 16 * 1024;

template <size_t BYTES>
__attribute__((target("sse"))) inline void prefetch_block(const void* block) {
    constexpr size_t ahead = (kPrefetchAhead / BYTES) * BYTES;
    const char* next = static_cast<const char*>(block) + ahead;
    for (size_t line = 0; line < BYTES; line += 64) _mm_prefetch(next + line, _MM_HINT_T1);
}

// acc + the sums of 4 products of unsigned bytes w and signed bytes x per 32-bit lane, as VNNI's
// dpbusd gives them, where every pair of products fits in 16 bits (w at most 63: 2 * 63 * 128).
__attribute__((target("avx2"))) inline __m256i dot_unsigned_avx2(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}

#define LOCALSPEC_AVX512_PAIR "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma"

// For the pair tiles (two groups at once): two groups' 32 bytes as one 512-bit vector, and two
// groups' 8 fp16 values as 16 floats.
__attribute__((target(LOCALSPEC_AVX512_PAIR))) inline __m512i pair_load(const void* a, const void* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(a))),
                              _mm256_loadu_si256(static_cast<const __m256i*>(b)), 1);
}

__attribute__((target(LOCALSPEC_AVX512_PAIR))) inline __m512 pair_fp16(const void* a, const void* b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(a))),
                                                   _mm_loadu_si128(static_cast<const __m128i*>(b)), 1));
}

// Two groups' 8 bytes as the 16 bytes of one 128-bit vector.
__attribute__((target(LOCALSPEC_AVX512_PAIR))) inline __m128i pair_bytes(const void* a, const void* b) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64(static_cast<const __m128i*>(a)), _mm_loadl_epi64(static_cast<const __m128i*>(b)));
}

// The 16 outputs of a pair tile's accumulator: group g's 8, then group g + 1's (valid as in
// store_group, counted from group g).
__attribute__((target(LOCALSPEC_AVX512_PAIR))) inline void store_pair(float* out, __m512 acc, int64_t valid) {
    store_group(out, _mm512_castps512_ps256(acc), valid);
    store_group(out + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)), valid - 8);
}

}  // namespace localspec

// A kernel's HeadKernels from its tile templates tile_avx512vnni<R>, tile_avxvnni<R> and
// tile_avx2<R> (tiles of up to 8 rows with AVX-512's 32 vector registers, 4 with AVX2's 16) and
// AVX-512's pair tiles pair_avx512vnni<R> (two groups at once), which run_tiles uses where a
// block's weights are in cache.
#define LOCALSPEC_TILE_KERNELS(JOB)                                                                       \
    {run_group_pairs<JOB, PairTiles<JOB, pair_avx512vnni<1>, pair_avx512vnni<2>, pair_avx512vnni<3>,      \
                                    pair_avx512vnni<4>, pair_avx512vnni<5>, pair_avx512vnni<6>,           \
                                    pair_avx512vnni<7>, pair_avx512vnni<8>, tile_avx512vnni<1>,           \
                                    tile_avx512vnni<2>, tile_avx512vnni<3>, tile_avx512vnni<4>,           \
                                    tile_avx512vnni<5>, tile_avx512vnni<6>, tile_avx512vnni<7>,           \
                                    tile_avx512vnni<8>>>,                                                 \
     run_groups<JOB, tile_avxvnni<1>, tile_avxvnni<2>, tile_avxvnni<3>, tile_avxvnni<4>>,                \
     run_groups<JOB, tile_avx2<1>, tile_avx2<2>, tile_avx2<3>, tile_avx2<4>>}

#endif
