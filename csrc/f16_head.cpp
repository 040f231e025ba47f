#include "f16_head.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LOCALSPEC_X86 1
#endif

namespace localspec {

// ---- the packed layout ---------------------------------------------------------------------
//
// Vocabulary rows go in groups of 8 (the last group padded with zero rows). For group g and
// column c, 8 fp16 values (16 bytes): lane r holds row 8g+r's weight c. One conversion gives
// a vector of the 8 rows' weights, multiplied by hidden value c broadcast: 8 logits at once.

F16Head::F16Head(const uint16_t* rows, int64_t n_vocab, int n_embd)
    : n_vocab_(n_vocab), n_groups_((n_vocab + 7) / 8), n_embd_(n_embd) {
    if (n_embd <= 0) throw std::invalid_argument("an F16 head needs columns");
    const size_t n_cols = static_cast<size_t>(n_embd);
    weights_ = std::make_unique<HugePageBuffer>(static_cast<size_t>(n_groups_) * n_cols * 8 * sizeof(uint16_t));
    auto* packed = reinterpret_cast<uint16_t*>(weights_->data());
    std::memset(packed, 0, weights_->size());  // padding rows: w = 0
    for (int64_t v = 0; v < n_vocab; ++v) {
        const size_t g = static_cast<size_t>(v / 8), lane = static_cast<size_t>(v % 8);
        const uint16_t* row = rows + static_cast<size_t>(v) * n_cols;
        for (size_t c = 0; c < n_cols; ++c) packed[(g * n_cols + c) * 8 + lane] = row[c];
    }
}

F16Head::~F16Head() = default;

namespace {

struct Job {
    const uint16_t* weights;
    int n_embd;
    const std::vector<float>* hidden;  // [row][column], each value rounded to fp16
    int n_rows;
    int64_t n_vocab;
    float* logits;
};

#ifdef LOCALSPEC_X86

// One group of 8 vocabulary rows against ROWS hidden rows (first_row ..). Each row's sum is
// split into CHAINS interleaved partial sums so that few rows still keep the FMA units busy
// (one sum would be a chain of n_embd dependent multiply-adds).
template <int ROWS>
__attribute__((target("avx2,fma,f16c"))) void tile(const Job& job, int64_t g, int first_row) {
    constexpr int CHAINS = ROWS <= 3 ? 4 : ROWS <= 6 ? 2 : 1;
    const int n_embd = job.n_embd;
    const uint16_t* w = job.weights + static_cast<size_t>(g) * static_cast<size_t>(n_embd) * 8;
    const float* x[ROWS];
    for (int j = 0; j < ROWS; ++j) x[j] = job.hidden->data() + static_cast<size_t>(first_row + j) * n_embd;
    __m256 acc[ROWS][CHAINS];
    for (int j = 0; j < ROWS; ++j) {
        for (int u = 0; u < CHAINS; ++u) acc[j][u] = _mm256_setzero_ps();
    }
    const int n_full = n_embd / CHAINS * CHAINS;
    for (int c = 0; c < n_full; c += CHAINS) {
#pragma GCC unroll 4
        for (int u = 0; u < CHAINS; ++u) {
            const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (c + u) * 8)));
#pragma GCC unroll 8
            for (int j = 0; j < ROWS; ++j) acc[j][u] = _mm256_fmadd_ps(wv, _mm256_broadcast_ss(x[j] + c + u), acc[j][u]);
        }
    }
    for (int c = n_full; c < n_embd; ++c) {
        const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c * 8)));
        for (int j = 0; j < ROWS; ++j) acc[j][0] = _mm256_fmadd_ps(wv, _mm256_broadcast_ss(x[j] + c), acc[j][0]);
    }
    const int64_t valid = std::min<int64_t>(8, job.n_vocab - g * 8);
    for (int j = 0; j < ROWS; ++j) {
        __m256 sum = acc[j][0];
        for (int u = 1; u < CHAINS; ++u) sum = _mm256_add_ps(sum, acc[j][u]);
        alignas(32) float out[8];
        _mm256_store_ps(out, sum);
        std::memcpy(job.logits + static_cast<size_t>(first_row + j) * job.n_vocab + g * 8, out,
                    sizeof(float) * static_cast<size_t>(valid));
    }
}

using Tile = void (*)(const Job&, int64_t, int);
constexpr Tile kTiles[] = {tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>, tile<7>, tile<8>};

void run_groups(const Job& job, int64_t g0, int64_t g1) {
    constexpr int kMaxRows = 8;
    const int n_tiles = (job.n_rows + kMaxRows - 1) / kMaxRows;  // equal tiles: 9 = 5 + 4
    for (int64_t g = g0; g < g1; ++g) {
        for (int t = 0, j = 0; t < n_tiles; ++t) {
            const int rows = (job.n_rows - j) / (n_tiles - t);
            kTiles[rows - 1](job, g, j);
            j += rows;
        }
    }
}

bool cpu_has_kernel() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

#else

void run_groups(const Job&, int64_t, int64_t) {}
bool cpu_has_kernel() { return false; }

#endif

}  // namespace

bool F16Head::cpu_supported() {
    static const bool supported = cpu_has_kernel();
    return supported;
}

void F16Head::compute(const float* hidden, int n_rows, float* logits, int n_threads) const {
    if (!cpu_supported()) throw std::logic_error("F16Head needs AVX2, FMA and F16C");
    // ggml rounds the hidden states to fp16 before the dot products (vec_dot_type F16).
    std::vector<float> rounded(static_cast<size_t>(n_rows) * static_cast<size_t>(n_embd_));
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = fp16_to_fp32(fp32_to_fp16(hidden[i]));
    const Job job{reinterpret_cast<const uint16_t*>(weights_->data()), n_embd_, &rounded, n_rows, n_vocab_, logits};
    parallel_slices(n_groups_, n_threads, [&](int64_t g0, int64_t g1) { run_groups(job, g0, g1); });
}

}  // namespace localspec
