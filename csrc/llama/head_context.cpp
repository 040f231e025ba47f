// HeadContext: the llama_context of an EAGLE-3 head next to its target's, which stops at the
// final norm (localspec computes the draft logits), and the state-row batches it shares with MTP.
#include "llama/llama_backend.h"

#include <llama.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "llama/graph_tap.h"
#include "llama/impl.h"

namespace localspec {

namespace {

// The graph nodes a head context copies: the encoder's output g = fc(features), and the
// decoder's state before and after the final norm.
enum HeadNode : size_t { kFcOut = 0, kPrenorm = 1, kNormed = 2 };

bool on_head_node(ggml_tensor* t, bool ask, void* user_data) {
    auto& tap = *static_cast<GraphTap*>(user_data);
    if (ask) return tap.wants(t);
    tap.capture(t);
    return std::strcmp(t->name, "result_norm") != 0;  // stop: llama.cpp's output layer never runs
}

}  // namespace

// Clears `batch` and puts rows start .. end - 1 of `rows` in it; returns the last one's index.
int32_t fill_state_batch(llama_batch_ext* batch, const StateRows& rows, int start, int end, const char* error) {
    llama_batch_ext_clear(batch);
    int32_t idx = -1;
    for (int i = start; i < end; ++i) {
        idx = llama_batch_ext_add_token(batch, 0, rows.tokens[i]);
        const llama_pos pos = rows.first_pos + i;
        const llama_embd state{rows.states + static_cast<size_t>(i) * static_cast<size_t>(rows.n_embd), 1,
                               static_cast<size_t>(rows.n_embd)};
        if (idx < 0 || !llama_batch_ext_set_pos(batch, idx, &pos) ||
            !llama_batch_ext_set_embd_token(batch, idx, state) ||
            (rows.logits_row >= 0 && !llama_batch_ext_set_output_logits(batch, idx, i == rows.logits_row))) {
            throw std::runtime_error(error);
        }
    }
    return idx;
}

struct HeadContext::Impl {
    llama_context* ctx = nullptr;
    llama_batch_ext* batch = nullptr;
    GraphTap tap{{"fc_out", "eagle3_prenorm-0", "result_norm"}};
    // Rows per llama_process call (the encoder takes one ubatch). llama.cpp sizes the head's
    // compute buffer for its logits scattered into the target's vocabulary, rows x n_vocab
    // floats, although localspec stops the graph before them: few rows keep that small.
    // localspec/planning/planner.py HEAD_UBATCH plans for the same number.
    int n_chunk = 64;
    ~Impl() {
        if (batch) llama_batch_ext_free(batch);
        if (ctx) llama_free(ctx);
    }
    void process(llama_process_type type) {
        take_last_error();
        const int32_t rc = llama_process(ctx, type, batch);
        if (rc != 0) {
            throw std::runtime_error("the EAGLE-3 head's pass failed with code " + std::to_string(rc) + ": " +
                                     take_last_error());
        }
    }
};

HeadContext::HeadContext(const Model& head, const Context& target, int n_threads, bool f32_cache)
    : impl_(std::make_unique<Impl>()), n_embd_(head.n_embd()) {
    llama_context_params params = llama_context_default_params();
    if (f32_cache) {
        params.type_k = params.type_v = GGML_TYPE_F32;
        params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    const int threads = n_threads > 0 ? n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    params.n_ctx = static_cast<uint32_t>(target.n_ctx());
    params.n_batch = params.n_ubatch = static_cast<uint32_t>(impl_->n_chunk);
    params.n_outputs_max = 1;  // no row asks for llama.cpp's logits
    params.n_seq_max = 1;
    params.n_threads = params.n_threads_batch = threads;
    params.no_perf = true;
    params.ctx_other = target.impl_->ctx;  // the head borrows the target's token embeddings
    params.cb_eval = on_head_node;
    params.cb_eval_user_data = &impl_->tap;
    take_last_error();
    impl_->ctx = llama_init_from_model(head.impl_->model, params);
    if (!impl_->ctx) {
        throw UserError(ErrorKind::ModelLoad, "could not create a context for the EAGLE-3 head '" + head.path() +
                                                  "': " + take_last_error());
    }
    impl_->batch = llama_batch_ext_init(impl_->ctx);
}

HeadContext::~HeadContext() = default;

void HeadContext::encode(const float* features, int n_rows, int width, std::vector<float>& g) {
    g.clear();
    for (int start = 0; start < n_rows; start += impl_->n_chunk) {
        const int end = std::min(n_rows, start + impl_->n_chunk);
        llama_batch_ext_clear(impl_->batch);
        for (int i = start; i < end; ++i) {
            const llama_embd row{features + static_cast<size_t>(i) * static_cast<size_t>(width), 1,
                                 static_cast<size_t>(width)};
            const int32_t idx = llama_batch_ext_add_embd(impl_->batch, 0, row);
            // The encoder is per row; its positions only have to continue the memory's.
            const llama_pos pos = n_positions_ + (i - start);
            if (idx < 0 || !llama_batch_ext_set_pos(impl_->batch, idx, &pos)) {
                throw std::runtime_error("could not build the EAGLE-3 head's encoder batch");
            }
        }
        impl_->tap.clear();
        impl_->process(LLAMA_PROCESS_TYPE_ENCODE);
        const auto& out = impl_->tap.rows(kFcOut);
        g.insert(g.end(), out.begin(), out.end());
    }
    if (g.size() != static_cast<size_t>(n_rows) * static_cast<size_t>(n_embd_)) {
        throw std::logic_error("the EAGLE-3 head's encoder returned the wrong number of rows");
    }
}

void HeadContext::decode(const Token* tokens, const float* g, int n_rows) {
    impl_->tap.clear();
    for (int start = 0; start < n_rows; start += impl_->n_chunk) {
        const int end = std::min(n_rows, start + impl_->n_chunk);
        fill_state_batch(impl_->batch, {tokens, g, n_embd_, n_positions_, -1}, start, end,
                         "could not build the EAGLE-3 head's decoder batch");
        impl_->process(LLAMA_PROCESS_TYPE_DECODE);
    }
    n_positions_ += n_rows;
    n_rows_ = n_rows;
    if (impl_->tap.n_rows(kNormed) != n_rows || impl_->tap.n_rows(kPrenorm) != n_rows) {
        throw std::runtime_error("the EAGLE-3 head's graph did not show its states (eagle3_prenorm, result_norm)");
    }
}

const float* HeadContext::prenorm(int row) const {
    return impl_->tap.rows(kPrenorm).data() + static_cast<size_t>(row) * static_cast<size_t>(n_embd_);
}

const float* HeadContext::normed(int row) const {
    return impl_->tap.rows(kNormed).data() + static_cast<size_t>(row) * static_cast<size_t>(n_embd_);
}

void HeadContext::truncate(int n_keep) {
    if (n_keep >= n_positions_) return;
    llama_memory_seq_rm(llama_get_memory(impl_->ctx), 0, static_cast<llama_pos>(n_keep), -1);
    n_positions_ = n_keep;
}

}  // namespace localspec
