// Rows of activations quantized as ggml quantizes them for its Q8_0 dot products (per 32
// values: d = max|x| / 127 stored as fp16, q = round(x / d)), unpacked for localspec's int8
// kernels (q8_head.cpp, q4k_matmul.cpp); and as ggml quantizes them for its Q6_K dot product
// (Q8_K, q6k_head.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/q8_head.h"

namespace localspec {

struct QuantizedRows {
    int n_rows = 0, n_blocks = 0;
    std::vector<Q8Block> blocks;  // ggml's own Q8_0 blocks, before unpacking
    std::vector<int32_t> words;  // [row][block][8]: the 32 int8 values, 4 per int32
    std::vector<int32_t> offset;  // [row][block]: -128 * sum of the block's values
    std::vector<float> sum;  // [row][block]: the sum of the block's values
    std::vector<float> scale;  // [row][block]: d as stored (fp16) and read back
};

// ggml's own quantize_row_q8_0 over n_rows rows of n_cols values (n_cols % 32 == 0). Fills `q`
// in place: a caller that keeps it (one per thread) allocates once.
void quantize_rows_into(QuantizedRows& q, const float* x, int n_rows, int n_cols);

// Rows quantized as ggml's Q8_K (per 256 values), for the Q6_K kernels (q6k_head.cpp).
struct Q8KRows {
    int n_rows = 0, n_super = 0;
    std::vector<int32_t> words;  // [row][super][j][4]: sub-block j's 16 int8 values, 4 per int32
    std::vector<int32_t> offset;  // [row][super][j]: -32 * (sum of sub-block j's values)
    std::vector<float> scale;  // [row][super]: d
};

// ggml's own quantize_row_q8_K (the one its Q6_K dot product uses) over n_rows rows of n_embd
// values (n_embd % 256 == 0), unpacked for the kernel. Fills `q` in place: a caller that keeps it
// (one per thread) allocates once.
void quantize_q8k_into(Q8KRows& q, const float* hidden, int n_rows, int n_embd);

}  // namespace localspec
