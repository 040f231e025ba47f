#include "kernels/exact_head.h"

#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace localspec {

namespace {

const ggml_type_traits_cpu* traits(int type) { return ggml_get_type_traits_cpu(static_cast<ggml_type>(type)); }

// Vocabulary rows per tile: their weights stay in cache while every hidden row passes them.
constexpr int64_t kTileRows = 16;

}  // namespace

bool ExactHead::supports(const ggml_tensor* weights) {
    if (!weights || !ggml_is_contiguous(weights) || weights->ne[2] != 1 || weights->ne[3] != 1) return false;
    const ggml_type_traits_cpu* t = traits(weights->type);
    if (!t || !t->vec_dot) return false;
    // A one-row dot product only: types whose kernels pair rows (nrows 2, ARM's int8 matmul)
    // would give a row bits that depend on its neighbour.
    if (t->nrows != 1) return false;
    return t->vec_dot_type == GGML_TYPE_F32 || traits(t->vec_dot_type)->from_float != nullptr;
}

ExactHead::ExactHead(const ggml_tensor* weights)
    : data_(static_cast<const uint8_t*>(weights->data)),
      row_bytes_(weights->nb[1]),
      type_(weights->type),
      n_vocab_(weights->ne[1]),
      n_embd_(static_cast<int>(weights->ne[0])) {
    if (!supports(weights)) throw std::invalid_argument("ggml's CPU backend has no one-row dot product for this head");
}

void ExactHead::compute(const float* hidden, int n_rows, float* logits, int n_threads, const std::string&) const {
    const ggml_type_traits_cpu* t = traits(type_);
    const auto dot_type = static_cast<ggml_type>(t->vec_dot_type);
    const size_t dot_row = ggml_row_size(dot_type, n_embd_);
    // The hidden rows in the dot product's type, converted as ggml converts src1 for one row.
    std::vector<uint8_t> converted(dot_row * static_cast<size_t>(n_rows));
    for (int j = 0; j < n_rows; ++j) {
        const float* x = hidden + static_cast<size_t>(j) * static_cast<size_t>(n_embd_);
        uint8_t* dst = converted.data() + static_cast<size_t>(j) * dot_row;
        if (dot_type == GGML_TYPE_F32) {
            std::memcpy(dst, x, dot_row);
        } else {
            traits(dot_type)->from_float(x, dst, n_embd_);
        }
    }
    const int64_t n_tiles = (n_vocab_ + kTileRows - 1) / kTileRows;
    split_over_threads(n_tiles, n_threads, [&](int64_t first, int64_t last) {
        for (int64_t tile = first; tile < last; ++tile) {
            const int64_t v0 = tile * kTileRows, v1 = std::min(n_vocab_, v0 + kTileRows);
            for (int j = 0; j < n_rows; ++j) {
                const uint8_t* x = converted.data() + static_cast<size_t>(j) * dot_row;
                float* out = logits + static_cast<size_t>(j) * static_cast<size_t>(n_vocab_);
                for (int64_t v = v0; v < v1; ++v) {
                    t->vec_dot(n_embd_, out + v, 0, data_ + static_cast<size_t>(v) * row_bytes_, 0, x, 0, 1);
                }
            }
        }
    });
}

}  // namespace localspec
