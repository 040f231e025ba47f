// Where localspec's output heads (q8_head.h, q6k_head.h) meet llama.cpp's graph. Includes ggml's
// headers, never llama.h: llama_backend.cpp installs HeadHook::on_graph_node as the context's
// eval callback and calls before_decode / after_decode around each llama_decode.
#pragma once

#include <memory>
#include <vector>

#include "head_common.h"

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

    // Exact mode: the head is ExactHead (exact_head.h) for any weight type ggml can multiply.
    void set_exact(bool exact) { exact_ = exact; }
    bool ready() const { return head_ != nullptr; }
    const char* name() const { return head_ ? head_->name() : "llama.cpp"; }
    // Before a decode: stop its graph after the final norm (only once ready()).
    void before_decode(bool take_rows);
    // After it: build the head the first time it was seen (if it is n_vocab rows), and
    // compute the captured rows' logits. True when this decode's logits are ours.
    bool after_decode(int n_rows, int n_vocab, int n_threads);
    const float* logits(int row, int n_vocab) const;

private:
    void inspect(const ggml_tensor* out);

    bool exact_ = false;
    bool armed_ = false;  // for the coming decode: stop after result_norm
    bool captured_ = false;  // the last decode stopped there; hidden_ holds its rows
    bool inspected_ = false;
    const ggml_tensor* weights_ = nullptr;  // a head in CPU memory we can compute, once seen
    std::vector<float> hidden_;
    std::unique_ptr<OutputHead> head_;
    std::vector<float> logits_;  // [row][n_vocab] of the last captured decode
};

}  // namespace localspec
