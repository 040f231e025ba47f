// Private to csrc/llama/ (never included from outside it): the state behind Model and Context
// (their Impl structs) and the helpers that several of llama_backend.h's source files share.
#pragma once

#include <llama.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/head_hook.h"
#include "llama/graph_tap.h"
#include "llama/llama_backend.h"
#include "rpc/rpc.h"

namespace localspec {

// ---- logging (log.cpp)

// The first error llama.cpp logged since the last call ("" when none), forgotten afterwards.
std::string take_last_error();

// ---- model (model.cpp)

struct Model::Impl {
    llama_model* model = nullptr;
    const llama_vocab* vocab = nullptr;
    std::vector<std::string> rpc;  // ggml's connections to ModelOptions::rpc (RpcAttachment)
    ~Impl() {
        // Freeing a model talks to its workers: after one failed, ggml would abort, so the
        // model is left allocated (rpc.h). Either way its connections are no longer in use.
        if (model && !rpc_failed(rpc)) llama_model_free(model);
        release_rpc(rpc);
    }
};

// Throws UserError(ModelLoad) when `path` is missing or not a GGUF file.
void check_gguf_file(const std::string& path);

// ---- llama.cpp's C++-only extensions (extensions.cpp)

// `mangled` looked up on the loaded libllama; null when absent.
void* libllama_symbol(const char* mangled);

// llama.cpp's NextN (MTP) functions: the hidden states the MTP layers read and the layer that runs.
struct NextnExt {
    void (*set)(llama_context*, bool, bool) = nullptr;
    float* (*get)(llama_context*) = nullptr;
    float* (*get_ith)(llama_context*, int32_t) = nullptr;
    void (*set_layer)(llama_context*, int32_t) = nullptr;
    bool ok() const { return set && get && get_ith && set_layer; }
};

// The NextN extension functions; throws UserError(InvalidParameter) when libllama lacks them.
NextnExt require_nextn_ext();

// ---- context (context.cpp)

// What a target context's eval callback serves: the layer tap copies its nodes, the head hook
// may stop the graph at the final norm (when fast_head).
struct TargetHooks {
    bool fast_head = false;
    HeadHook hook;  // localspec's output head
    GraphTap tap;  // the inputs of ContextOptions::tap_layers
    bool tapping = true;  // Context::set_tapping
};

struct Context::Impl {
    llama_context* ctx = nullptr;
    llama_batch batch{};
    int n_batch = 0;
    int n_ubatch = 0;
    int n_threads = 1;
    bool fast_head = false;
    TargetHooks hooks;  // the head hook and the layer tap
    HeadHook& hook = hooks.hook;
    NextnExt nextn;  // set when ContextOptions::nextn_features
    bool used_head = false;  // the last decode's logits come from `hook`
    bool exact = false;
    bool pad_rows = false;  // exact mode with sgemm-type matrices (pad_batch)
    struct {
        int front = 0, back = 0;  // output rows added before / after the asked-for ones
    } padding;  // of the last decode's last piece
    std::vector<std::string> rpc;  // the model's RPC workers (checked before every pass)
    ~Impl() {
        if (batch.token) llama_batch_free(batch);
        if (ctx && !rpc_failed(rpc)) llama_free(ctx);  // see Model::Impl
    }
};

// ---- state rows, the input of the EAGLE-3 head's and the MTP layers' contexts (head_context.cpp)

// A drafter's input rows: token i at position first_pos + i reads the n_embd floats at
// states + i * n_embd as its state; row logits_row (-1: none) asks for logits.
struct StateRows {
    const Token* tokens;
    const float* states;
    int n_embd;
    int first_pos;
    int logits_row;
};

// Clears `batch` and puts rows start .. end - 1 of `rows` in it; returns the last one's index.
int32_t fill_state_batch(llama_batch_ext* batch, const StateRows& rows, int start, int end, const char* error);

}  // namespace localspec
