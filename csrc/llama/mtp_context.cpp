// MtpContext: the llama_context that runs a target's MTP (NextN) layers on the target's own
// model, through llama.cpp's extension functions.
#include "llama/llama_backend.h"

#include <llama.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/errors.h"
#include "llama/impl.h"

namespace localspec {

struct MtpContext::Impl {
    llama_context* ctx = nullptr;
    llama_batch_ext* batch = nullptr;
    NextnExt nextn;
    int n_chunk = 64;  // rows per llama_process call
    int32_t last = -1;  // batch index of the last decode's output row
    ~Impl() {
        if (batch) llama_batch_ext_free(batch);
        if (ctx) llama_free(ctx);
    }
};

MtpContext::MtpContext(const Model& target_model, const Context& target, int n_threads)
    : impl_(std::make_unique<Impl>()) {
    impl_->nextn = require_nextn_ext();
    llama_model* model = target_model.impl_->model;
    if (llama_model_n_layer_nextn(model) <= 0) {
        throw UserError(ErrorKind::InvalidParameter, "'" + target_model.path() +
                                                         "' was loaded without MTP layers; it cannot draft with them.");
    }
    n_embd_ = llama_model_n_embd_out(model);
    n_vocab_ = target.n_vocab();
    n_layers_ = llama_model_n_layer_nextn(model);
    llama_context_params params = llama_context_default_params();
    const int threads = n_threads > 0 ? n_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    params.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    params.n_ctx = static_cast<uint32_t>(target.n_ctx());
    params.n_batch = params.n_ubatch = static_cast<uint32_t>(impl_->n_chunk);
    params.n_outputs_max = 1;  // logits for the last row of a decode only
    params.n_seq_max = 1;
    params.n_threads = params.n_threads_batch = threads;
    params.no_perf = true;
    params.swa_full = true;
    take_last_error();
    impl_->ctx = llama_init_from_model(model, params);
    if (!impl_->ctx) {
        throw UserError(ErrorKind::ModelLoad, "could not create a context for the MTP layers of '" +
                                                  target_model.path() + "': " + take_last_error());
    }
    impl_->nextn.set(impl_->ctx, true, true);  // the output row's hidden state
    impl_->batch = llama_batch_ext_init(impl_->ctx);
}

MtpContext::~MtpContext() = default;

void MtpContext::decode(const Token* tokens, const float* h, int n_rows, int layer) {
    if (layer < 0 || layer >= n_layers_) throw std::logic_error("no such MTP layer: " + std::to_string(layer));
    impl_->nextn.set_layer(impl_->ctx, layer);
    for (int start = 0; start < n_rows; start += impl_->n_chunk) {
        const int end = std::min(n_rows, start + impl_->n_chunk);
        const int32_t last = fill_state_batch(impl_->batch, {tokens, h, n_embd_, n_positions_, n_rows - 1},
                                              start, end, "could not build the MTP layers' batch");
        if (end == n_rows) impl_->last = last;
        take_last_error();
        const int32_t rc = llama_process(impl_->ctx, LLAMA_PROCESS_TYPE_DECODE, impl_->batch);
        if (rc != 0) {
            throw std::runtime_error("the MTP layers' pass failed with code " + std::to_string(rc) + ": " +
                                     take_last_error());
        }
    }
    n_positions_ += n_rows;
}

const float* MtpContext::logits() const {
    const float* out = llama_get_logits_ith(impl_->ctx, impl_->last);
    if (!out) throw std::runtime_error("llama.cpp returned no logits for the MTP layers' last row");
    return out;
}

const float* MtpContext::state() const {
    const float* out = impl_->nextn.get_ith(impl_->ctx, impl_->last);
    if (!out) throw std::runtime_error("llama.cpp returned no hidden state for the MTP layers' last row");
    return out;
}

void MtpContext::truncate(int n_keep) {
    if (n_keep >= n_positions_) return;
    llama_memory_seq_rm(llama_get_memory(impl_->ctx), 0, static_cast<llama_pos>(n_keep), -1);
    n_positions_ = n_keep;
}

}  // namespace localspec
