// Where localspec's output heads (q8_head.h, q6k_head.h) meet llama.cpp's graph. Includes ggml's
// headers, never llama.h: csrc/llama/context.cpp installs HeadHook::on_graph_node as the
// context's eval callback and calls before_decode / after_decode around each llama_decode.
#pragma once

#include <memory>
#include <vector>

#include "kernels/head_common.h"

struct ggml_tensor;

namespace localspec {

// llama.cpp asks the eval callback about every graph node before it runs. The hook finds the
// output head (node "result_output" = MUL_MAT(weights, "result_norm")); when a decode is armed
// it copies the hidden states "result_norm", stops the graph there (llama.cpp never runs its
// head) and computes the logits with localspec's head for the weights' type (Q8_0 or Q6_K).
// Anything else in the head (a bias, a logit soft-cap, another type, weights outside CPU
// memory) and the hook stands aside.
class HeadHook {
public:
    static bool on_graph_node(ggml_tensor* t, bool ask, void* user_data);  // the eval callback

    // Exact mode: a batched head (Q8_0, Q6_K on AVX2 CPUs) or ExactHead (exact_head.h) for any
    // other weight type ggml can multiply.
    void set_exact(bool exact) { exact_ = exact; }
    // A reduced vocabulary (a draft model's head, FR-Spec): logits are computed for token ids
    // below `rows` alone and the rest are -infinity, so nothing above it is ever drafted; the
    // target's correction still reaches every token. 0: the whole vocabulary. A batched head
    // (Q8_0, Q6_K) only; before the first decode.
    void set_row_limit(int64_t rows) { row_limit_ = rows; }
    bool ready() const { return head_ != nullptr; }
    const char* name() const { return head_ ? head_->name() : "llama.cpp"; }
    // Before a decode: stop its graph after the final norm (only once ready()).
    void before_decode(bool take_rows);
    // After it: build the head the first time it was seen (if it is n_vocab rows), and
    // compute the captured rows' logits. True when this decode's logits are ours. `only`
    // (empty, or one entry per row): where only[r] is not empty, row r's logits are needed
    // at those tokens alone; when the head computes chosen tokens (OutputHead::computes_ids),
    // row r's other entries are then left unset.
    bool after_decode(int n_rows, int n_vocab, int n_threads, const std::vector<std::vector<int32_t>>& only = {});
    const float* logits(int row, int n_vocab) const;
    // Rows of the last captured decode computed at chosen tokens alone.
    int chosen_rows() const { return n_chosen_; }

private:
    void inspect(const ggml_tensor* out);

    bool exact_ = false;
    int64_t row_limit_ = 0;
    bool armed_ = false;  // for the coming decode: stop after result_norm
    bool captured_ = false;  // the last decode stopped there; hidden_ holds its rows
    bool inspected_ = false;
    const ggml_tensor* weights_ = nullptr;  // a head in CPU memory we can compute, once seen
    std::vector<float> hidden_;
    std::unique_ptr<OutputHead> head_;
    // Computes the whole rows in one call and the rows of `only` one by one: slot_[row] is
    // where a row's logits are in logits_ (the whole rows first).
    void compute_rows(int n_rows, int n_vocab, int n_threads, const std::vector<std::vector<int32_t>>& only);

    std::vector<float> logits_;  // [slot][n_vocab] of the last captured decode
    std::vector<int> slot_;      // [row]: its slot in logits_
    int n_chosen_ = 0;
    std::vector<float> whole_;   // the hidden states of the whole rows, when some rows are not
};

}  // namespace localspec
