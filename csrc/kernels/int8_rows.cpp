#include "kernels/int8_rows.h"

#include <cstring>

#include "ggml-cpu.h"
#include "kernels/head_common.h"

namespace localspec {

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

}  // namespace localspec
