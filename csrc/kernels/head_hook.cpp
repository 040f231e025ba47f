#include "kernels/head_hook.h"

#include <algorithm>
#include <limits>

#include <ggml-backend.h>
#include <ggml.h>

#include <cstring>
#include <stdexcept>

#include "kernels/exact_head.h"
#include "kernels/q6k_head.h"
#include "kernels/q8_head.h"

namespace localspec {

namespace {
bool is_host(const ggml_tensor* t) { return t->buffer && ggml_backend_buffer_is_host(t->buffer); }

// Q8_0 and Q6_K heads have batched kernels (q8_head.h, q6k_head.h) on CPUs with AVX2 at least.
// Their logits are batch-invariant: a row's integer block sums are exact and its float sum runs
// over the blocks in one order whatever the number of rows in the call or the row's place in
// it, so exact mode uses them as well (the bits are not llama.cpp's one-row bits, but every row
// of every pass gets the same ones, which is all exact mode promises).
bool batched_head_fits(const ggml_tensor* weights) {
    if (!weights || !ggml_is_contiguous(weights) || head_kernel_names().empty()) return false;
    return weights->type == GGML_TYPE_Q8_0 || weights->type == GGML_TYPE_Q6_K;
}
}  // namespace

void HeadHook::inspect(const ggml_tensor* out) {
    inspected_ = true;
    const ggml_tensor* weights = out->src[0];
    const ggml_tensor* hidden = out->src[1];
    const bool plain_matmul = out->op == GGML_OP_MUL_MAT && weights && hidden &&
                              std::strcmp(hidden->name, "result_norm") == 0;
    const bool batched = batched_head_fits(weights);
    // Exact mode takes any type ggml multiplies: a batched head where one fits (its rows are
    // batch-invariant too), ExactHead otherwise.
    const bool ours = batched || (exact_ && ExactHead::supports(weights));
    if (plain_matmul && ours && is_host(weights)) {
        weights_ = weights;
    }
}

bool HeadHook::on_graph_node(ggml_tensor* t, bool ask, void* user_data) {
    auto& hook = *static_cast<HeadHook*>(user_data);
    if (ask) {
        if (!hook.inspected_ && std::strcmp(t->name, "result_output") == 0) hook.inspect(t);
        return hook.armed_ && std::strcmp(t->name, "result_norm") == 0;
    }
    // t is "result_norm", just computed.
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || !is_host(t)) return true;
    const auto* data = static_cast<const float*>(t->data);
    hook.hidden_.assign(data, data + ggml_nelements(t));
    hook.captured_ = true;
    return false;  // skip the rest of the graph: llama.cpp's head
}

void HeadHook::before_decode(bool take_rows) {
    armed_ = take_rows && head_ != nullptr;
    captured_ = false;
}

bool HeadHook::after_decode(int n_rows, int n_vocab, int n_threads, const std::vector<std::vector<int32_t>>& only) {
    armed_ = false;
    if (!head_ && weights_) {
        const int64_t rows = weights_->ne[1];
        const int n_embd = static_cast<int>(weights_->ne[0]);
        if (rows == n_vocab && batched_head_fits(weights_)) {
            // Row r's weights start r rows into the tensor: the first `used` rows are a head
            // of their own. Whole groups of 8 rows (the kernels' unit), never past the tensor.
            const int64_t used = row_limit_ > 0 && row_limit_ < rows ? std::min(rows, (row_limit_ + 7) / 8 * 8) : rows;
            if (weights_->type == GGML_TYPE_Q8_0) {
                head_ = std::make_unique<Q8Head>(static_cast<const Q8Block*>(weights_->data), used, n_embd);
            } else {
                head_ = std::make_unique<Q6KHead>(static_cast<const Q6KBlock*>(weights_->data), used, n_embd);
            }
        } else if (rows == n_vocab && exact_) {
            head_ = std::make_unique<ExactHead>(weights_);
        }
        weights_ = nullptr;
    }
    if (!captured_) return false;
    captured_ = false;
    if (hidden_.size() != static_cast<size_t>(n_rows) * static_cast<size_t>(head_->n_embd())) {
        throw std::logic_error("the captured hidden states do not match the logits rows");
    }
    logits_.resize(static_cast<size_t>(n_rows) * static_cast<size_t>(n_vocab));
    compute_rows(n_rows, n_vocab, n_threads, only);
    return true;
}

void HeadHook::compute_rows(int n_rows, int n_vocab, int n_threads, const std::vector<std::vector<int32_t>>& only) {
    const auto chosen = [&](int r) {
        return head_->computes_ids() && head_->n_vocab() == n_vocab && static_cast<size_t>(r) < only.size() &&
               !only[static_cast<size_t>(r)].empty();
    };
    slot_.resize(static_cast<size_t>(n_rows));
    n_chosen_ = 0;
    for (int r = 0; r < n_rows; ++r) n_chosen_ += chosen(r) ? 1 : 0;
    if (n_chosen_ == 0) {  // every row whole, in place: slot r is row r
        for (int r = 0; r < n_rows; ++r) slot_[static_cast<size_t>(r)] = r;
        const int64_t used = head_->n_vocab();
        if (used == n_vocab) {
            head_->compute(hidden_.data(), n_rows, logits_.data(), n_threads);
            return;
        }
        // A reduced vocabulary: rows of `used` logits, spread to n_vocab with -inf after them.
        std::vector<float>& reduced = whole_;
        reduced.resize(static_cast<size_t>(n_rows) * static_cast<size_t>(used));
        head_->compute(hidden_.data(), n_rows, reduced.data(), n_threads);
        for (int r = n_rows - 1; r >= 0; --r) {
            float* row = logits_.data() + static_cast<size_t>(r) * static_cast<size_t>(n_vocab);
            const float* from = reduced.data() + static_cast<size_t>(r) * static_cast<size_t>(used);
            std::copy(from, from + used, row);
            std::fill(row + used, row + n_vocab, -std::numeric_limits<float>::infinity());
        }
        return;
    }
    const size_t n_embd = static_cast<size_t>(head_->n_embd());
    int n_whole = 0;
    whole_.clear();
    for (int r = 0; r < n_rows; ++r) {
        if (chosen(r)) continue;
        slot_[static_cast<size_t>(r)] = n_whole++;
        const auto row = hidden_.begin() + static_cast<long>(static_cast<size_t>(r) * n_embd);
        whole_.insert(whole_.end(), row, row + static_cast<long>(n_embd));
    }
    if (n_whole > 0) head_->compute(whole_.data(), n_whole, logits_.data(), n_threads);
    int next = n_whole;
    for (int r = 0; r < n_rows; ++r) {
        if (!chosen(r)) continue;
        slot_[static_cast<size_t>(r)] = next;
        head_->compute_ids(hidden_.data() + static_cast<size_t>(r) * n_embd, only[static_cast<size_t>(r)],
                           logits_.data() + static_cast<size_t>(next++) * static_cast<size_t>(n_vocab));
    }
}

const float* HeadHook::logits(int row, int n_vocab) const {
    return logits_.data() + static_cast<size_t>(slot_.at(static_cast<size_t>(row))) * static_cast<size_t>(n_vocab);
}

}  // namespace localspec
