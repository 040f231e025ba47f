#include "kernels/int8_rows.h"

#include <cstring>

#include "ggml-cpu.h"
#include "kernels/head_common.h"

namespace localspec {

namespace {

// ggml's block_q8_K: 256 int8 values, their float scale d and (unused here) sums per 16.
struct Q8KBlock {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
};
static_assert(sizeof(Q8KBlock) == 292, "block_q8_K is 292 bytes");

}  // namespace

void quantize_rows_into(QuantizedRows& q, const float* x, int n_rows, int n_cols) {
    q.n_rows = n_rows;
    q.n_blocks = n_cols / 32;
    const size_t n_all = static_cast<size_t>(n_rows) * static_cast<size_t>(q.n_blocks);
    q.blocks.resize(n_all);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float(x, q.blocks.data(), static_cast<int64_t>(n_all) * 32);
    q.words.resize(n_all * 8);
    q.offset.resize(n_all);
    q.sum.resize(n_all);
    q.scale.resize(n_all);
    for (size_t rb = 0; rb < n_all; ++rb) {
        int sum = 0;
        for (int8_t v : q.blocks[rb].qs) sum += v;
        std::memcpy(&q.words[rb * 8], q.blocks[rb].qs, 32);
        q.offset[rb] = -128 * sum;
        q.sum[rb] = static_cast<float>(sum);
        q.scale[rb] = fp16_to_fp32(q.blocks[rb].d);
    }
}

void quantize_q8k_into(Q8KRows& q, const float* hidden, int n_rows, int n_embd) {
    q.n_rows = n_rows;
    q.n_super = n_embd / 256;
    const size_t n_all = static_cast<size_t>(n_rows) * static_cast<size_t>(q.n_super);
    thread_local std::vector<Q8KBlock> blocks;
    blocks.resize(n_all);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(hidden, blocks.data(),
                                                         static_cast<int64_t>(n_all) * 256);
    q.words.resize(n_all * 64);
    q.offset.resize(n_all * 16);
    q.scale.resize(n_all);
    for (size_t rs = 0; rs < n_all; ++rs) {
        const Q8KBlock& block = blocks[rs];
        std::memcpy(&q.words[rs * 64], block.qs, 256);
        for (int j = 0; j < 16; ++j) {  // summed here: ggml leaves bsums unset for an all-zero block
            int sum = 0;
            for (int i = 0; i < 16; ++i) sum += block.qs[16 * j + i];
            q.offset[rs * 16 + static_cast<size_t>(j)] = -32 * sum;
        }
        q.scale[rs] = block.d;
    }
}

}  // namespace localspec
