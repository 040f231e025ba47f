// The only file that includes llama.h: RAII wrappers for models and contexts, the KV-cache
// bookkeeping, log routing, devices and quantization.
#include "llama/llama_backend.h"

#include <llama.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "kernels/body_matmul.h"
#include "base/errors.h"
#include "llama/graph_tap.h"
#include "kernels/head_common.h"
#include "kernels/head_hook.h"
#include "rpc/rpc.h"

namespace localspec {

// ---- logging -----------------------------------------------------------------------------

namespace {

// llama.cpp has one process-wide log callback; this sink is its user_data.
struct LogSink {
    std::mutex mutex;
    bool verbose = false;
    std::string last_error;
};

LogSink& log_sink() {
    static LogSink sink;
    return sink;
}

void on_log(ggml_log_level level, const char* text, void* user_data) {
    auto* sink = static_cast<LogSink*>(user_data);
    std::lock_guard<std::mutex> lock(sink->mutex);
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::string line(text);
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
        // The first error is the cause; later ones ("failed to load model") only summarise.
        if (!line.empty() && sink->last_error.empty()) sink->last_error = line;
    }
    if (sink->verbose) std::fputs(text, stderr);
}

std::string take_last_error() {
    LogSink& sink = log_sink();
    std::lock_guard<std::mutex> lock(sink.mutex);
    std::string out;
    out.swap(sink.last_error);
    return out;
}

}  // namespace

void backend_init(bool verbose) {
    static std::once_flag once;
    LogSink& sink = log_sink();
    {
        std::lock_guard<std::mutex> lock(sink.mutex);
        sink.verbose = sink.verbose || verbose;
    }
    std::call_once(once, [&] {
        llama_log_set(on_log, &sink);
        llama_backend_init();
    });
}

// ---- model ---------------------------------------------------------------------------------

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

namespace {

// A cheap first check, so that the common mistakes get a precise sentence.
void check_gguf_file(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) {
        throw UserError(ErrorKind::ModelLoad,
                        "model file '" + path + "' does not exist or cannot be read; check the path.");
    }
    char magic[4] = {0, 0, 0, 0};
    file.read(magic, 4);
    if (file.gcount() != 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        throw UserError(ErrorKind::ModelLoad, "'" + path +
                                                  "' is not a GGUF file (wrong magic bytes); "
                                                  "pass a .gguf model file.");
    }
}

// The local devices llama.cpp would offload to by default (discrete GPUs, else integrated
// ones), never an RPC device.
std::vector<ggml_backend_dev_t> local_offload_devices() {
    std::vector<ggml_backend_dev_t> gpus, igpus;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (std::strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") == 0) continue;
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU) gpus.push_back(dev);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_IGPU) igpus.push_back(dev);
    }
    return gpus.empty() ? igpus : gpus;
}

// Where a model spread over RPC workers goes: their devices first, then the local GPUs (the
// last device gets the output layer); without a local GPU the output layer is pinned to host
// memory. Both lists end with their terminator and must outlive the load.
struct RemotePlacement {
    std::vector<ggml_backend_dev_t> devices;
    std::vector<llama_model_tensor_buft_override> overrides;

    // The connections in use for the model (it releases them: Model::Impl).
    std::vector<std::string> apply(const std::vector<std::string>& endpoints, llama_model_params& params) {
        RpcAttachment attachment = attach_rpc(endpoints);
        devices = std::move(attachment.devices);
        const std::vector<ggml_backend_dev_t> local = local_offload_devices();
        devices.insert(devices.end(), local.begin(), local.end());
        devices.push_back(nullptr);
        params.devices = devices.data();
        if (local.empty()) {
            overrides = {{"^(output|output_norm|token_embd)\\.", ggml_backend_cpu_buffer_type()}, {nullptr, nullptr}};
            params.tensor_buft_overrides = overrides.data();
        }
        return attachment.connections;
    }
};

}  // namespace

Model::Model(const ModelOptions& options) : impl_(std::make_unique<Impl>()), path_(options.path) {
    check_gguf_file(path_);
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = options.n_gpu_layers;
    params.vocab_only = options.vocab_only;
    params.use_extra_bufts = options.repack;
    params.load_mtp = options.load_mtp;
    RemotePlacement remote;
    if (!options.rpc.empty() && !options.vocab_only) {
        impl_->rpc = remote.apply(options.rpc, params);
    }

    take_last_error();
    std::optional<BodyKernelClaim> claim;  // before any load: llama.cpp reads ggml's list once
    if (body_kernels_available() && options.body_kernels && !options.vocab_only) {
        params.use_extra_bufts = true;  // localspec's buffer type is first in that list
        // A GPU build lists the GPU's pinned host buffer type before every extra one, so that
        // a CPU-held layer's prompt batches can be computed on the GPU (op offload). Exact mode
        // holds every target layer on the CPU with op offload off: the pinned memory buys
        // nothing there, and skipping it lets localspec's kernels take the body (measured on
        // an H200 machine: with it, no matrix reached localspec's buffer type).
        if (options.body_kernels == BodyKernelClaim::All) params.no_host = true;
        claim.emplace(static_cast<BodyKernelClaim::Scope>(options.body_kernels));
    }
    impl_->model = llama_model_load_from_file(path_.c_str(), params);
    if (!impl_->model) {
        check_rpc_alive(impl_->rpc);  // a worker lost while loading: that sentence
        std::string reason = take_last_error();
        if (reason.empty()) reason = "llama.cpp refused it";
        throw UserError(ErrorKind::ModelLoad, "could not load '" + path_ + "': " + reason +
                                                  " (is the file complete? download or copy it again)");
    }
    impl_->vocab = llama_model_get_vocab(impl_->model);
}

Model::~Model() = default;

VocabInfo Model::vocab() const {
    VocabInfo info;
    info.type = static_cast<int>(llama_vocab_type(impl_->vocab));
    info.n_tokens = llama_vocab_n_tokens(impl_->vocab);
    info.bos = llama_vocab_bos(impl_->vocab);
    info.eos = llama_vocab_eos(impl_->vocab);
    return info;
}

std::string Model::token_text(Token token) const {
    const char* text = llama_vocab_get_text(impl_->vocab, token);
    return text ? std::string(text) : std::string();
}

std::string Model::token_piece(Token token, bool special) const {
    char buf[256];
    int32_t n = llama_token_to_piece(impl_->vocab, token, buf, sizeof(buf), 0, special);
    if (n >= 0) return std::string(buf, static_cast<size_t>(n));
    std::string big(static_cast<size_t>(-n), '\0');
    n = llama_token_to_piece(impl_->vocab, token, big.data(), -n, 0, special);
    big.resize(static_cast<size_t>(std::max(n, 0)));
    return big;
}

bool Model::is_end_of_generation(Token token) const { return llama_vocab_is_eog(impl_->vocab, token); }

bool Model::add_bos() const { return llama_vocab_get_add_bos(impl_->vocab); }

std::vector<Token> Model::tokenize(const std::string& text, bool add_special, bool parse_special) const {
    int32_t n_max = static_cast<int32_t>(text.size()) + 8;
    std::vector<Token> tokens(static_cast<size_t>(n_max));
    int32_t n = llama_tokenize(impl_->vocab, text.data(), static_cast<int32_t>(text.size()),
                               tokens.data(), n_max, add_special, parse_special);
    if (n < 0) {
        tokens.resize(static_cast<size_t>(-n));
        n = llama_tokenize(impl_->vocab, text.data(), static_cast<int32_t>(text.size()),
                           tokens.data(), -n, add_special, parse_special);
    }
    tokens.resize(static_cast<size_t>(std::max(n, 0)));
    return tokens;
}

std::string Model::detokenize(const std::vector<Token>& tokens) const {
    std::string out;
    for (Token t : tokens) out += token_piece(t);
    return out;
}

std::string Model::chat_template() const {
    const char* tmpl = llama_model_chat_template(impl_->model, nullptr);
    return tmpl ? std::string(tmpl) : std::string();
}

std::string Model::description() const {
    char buf[256];
    int n = llama_model_desc(impl_->model, buf, sizeof(buf));
    return n > 0 ? std::string(buf, static_cast<size_t>(std::min<int>(n, sizeof(buf) - 1))) : "";
}

std::string Model::metadata(const std::string& key) const {
    int32_t n = llama_model_meta_val_str(impl_->model, key.c_str(), nullptr, 0);
    if (n < 0) return "";
    std::string out(static_cast<size_t>(n) + 1, '\0');
    llama_model_meta_val_str(impl_->model, key.c_str(), out.data(), out.size());
    out.resize(static_cast<size_t>(n));
    return out;
}

int Model::n_ctx_train() const { return llama_model_n_ctx_train(impl_->model); }

int Model::n_layer() const { return llama_model_n_layer(impl_->model); }

int Model::n_embd() const { return llama_model_n_embd(impl_->model); }

int Model::n_layer_nextn() const { return llama_model_n_layer_nextn(impl_->model); }

std::string Model::architecture() const { return metadata("general.architecture"); }

uint64_t Model::size_bytes() const { return llama_model_size(impl_->model); }

std::string Model::memory_kind() const {
    if (llama_model_is_hybrid(impl_->model)) return "hybrid";
    if (llama_model_is_recurrent(impl_->model)) return "recurrent";
    return "attention";
}

// ---- llama.cpp's C++-only extensions -------------------------------------------------------

// llama.cpp declares a few functions only in its internal src/llama-ext.h (C++ linkage: mangled
// names). They are looked up at run time on the loaded libllama, so that a libllama without
// them leaves `import localspec` working and only what needs them reports it: MTP drafting
// (the target's and the MTP layers' final hidden states) and the cross-check of the layer tap
// against llama.cpp's own layer-input extraction. LOCALSPEC_HIDE_LLAMA_EXT=1 makes them look
// absent (for tests).
namespace {

void* libllama_symbol(const char* mangled) {
    const char* hide = std::getenv("LOCALSPEC_HIDE_LLAMA_EXT");
    if (hide && *hide && std::strcmp(hide, "0") != 0) return nullptr;
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&llama_backend_init), &info) || !info.dli_fname) return nullptr;
    void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    return lib ? dlsym(lib, mangled) : nullptr;
}

struct NextnExt {
    void (*set)(llama_context*, bool, bool) = nullptr;
    float* (*get)(llama_context*) = nullptr;
    float* (*get_ith)(llama_context*, int32_t) = nullptr;
    void (*set_layer)(llama_context*, int32_t) = nullptr;
    bool ok() const { return set && get && get_ith && set_layer; }
};

NextnExt nextn_ext() {
    NextnExt ext;
    // void llama_set_embeddings_nextn(llama_context*, bool value, bool masked)
    ext.set = reinterpret_cast<decltype(ext.set)>(libllama_symbol("_Z26llama_set_embeddings_nextnP13llama_contextbb"));
    // float* llama_get_embeddings_nextn(llama_context*)
    ext.get = reinterpret_cast<decltype(ext.get)>(libllama_symbol("_Z26llama_get_embeddings_nextnP13llama_context"));
    // float* llama_get_embeddings_nextn_ith(llama_context*, int32_t)
    ext.get_ith = reinterpret_cast<decltype(ext.get_ith)>(libllama_symbol("_Z30llama_get_embeddings_nextn_ithP13llama_contexti"));
    // void llama_set_nextn_layer_offset(llama_context*, int32_t offset): which NextN layer runs
    ext.set_layer = reinterpret_cast<decltype(ext.set_layer)>(libllama_symbol("_Z28llama_set_nextn_layer_offsetP13llama_contexti"));
    return ext;
}

NextnExt require_nextn_ext() {
    NextnExt ext = nextn_ext();
    if (!ext.ok()) throw UserError(ErrorKind::InvalidParameter, nextn_extension_missing());
    return ext;
}

}  // namespace

std::string nextn_extension_missing() {
    if (nextn_ext().ok()) return "";
    return "this libllama does not export llama_set_embeddings_nextn / llama_get_embeddings_nextn / "
           "llama_set_nextn_layer_offset (llama-cpp-python "
           "0.3.36 does), so MTP layers cannot draft; install that version or use another drafter.";
}

// ---- context -------------------------------------------------------------------------------

namespace {

// What a target context's eval callback serves: the layer tap copies its nodes, the head hook
// may stop the graph at the final norm (when fast_head).
struct TargetHooks {
    bool fast_head = false;
    HeadHook hook;  // localspec's output head
    GraphTap tap;  // the inputs of ContextOptions::tap_layers
    bool tapping = true;  // Context::set_tapping
};

bool on_target_node(ggml_tensor* t, bool ask, void* user_data) {
    auto& hooks = *static_cast<TargetHooks*>(user_data);
    if (ask) {
        const bool tap = hooks.tapping && hooks.tap.wants(t);
        const bool head = hooks.fast_head && HeadHook::on_graph_node(t, true, &hooks.hook);
        return tap || head;
    }
    if (hooks.tapping && hooks.tap.wants(t)) {
        hooks.tap.capture(t);
        return true;
    }
    return HeadHook::on_graph_node(t, false, &hooks.hook);
}

}  // namespace

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

namespace {

GraphTap layer_tap(const Model& model, const std::vector<int>& layers) {
    std::vector<std::string> names;
    for (int il : layers) {
        if (il < 1 || il >= model.n_layer()) {
            throw UserError(ErrorKind::InvalidParameter,
                            "the drafter reads the input of layer " + std::to_string(il) + ", but '" +
                                model.path() + "' has layers 0.." + std::to_string(model.n_layer() - 1) +
                                " and localspec reads layers 1.." + std::to_string(model.n_layer() - 1) +
                                "; use a head made for this target.");
        }
        names.push_back(layer_input_name(il));
    }
    return GraphTap(names);
}

// Exact mode asks ggml's CPU backend of its own context for the reference kernels
// (ggml_backend_cpu_set_use_ref): no tiled K-quant matmul (from 8 rows it sums in another order
// than the one-row dot product) and no tiled or cache-split flash attention (every query row then
// runs the same loop over the whole cache, so an F16 cache is batch-invariant too). The switch
// belongs to that context's backend only; llama.cpp keeps its backends in the context's
// scheduler, which only its C++ member llama_context::get_sched() returns.
void use_reference_kernels(llama_context* ctx) {
    // ggml_backend_sched_t llama_context::get_sched() const (a member: `this` is the first argument)
    using GetSched = ggml_backend_sched_t (*)(const llama_context*);
    const auto get_sched = reinterpret_cast<GetSched>(libllama_symbol("_ZNK13llama_context9get_schedEv"));
    if (!get_sched) {
        throw UserError(ErrorKind::InvalidParameter,
                        "this libllama does not export llama_context::get_sched (llama-cpp-python 0.3.36 "
                        "does), so exact mode cannot choose its kernels; install that version or leave out --exact.");
    }
    ggml_backend_sched_t sched = get_sched(ctx);
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
        ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
        ggml_backend_dev_t device = ggml_backend_get_device(backend);
        if (device == nullptr || ggml_backend_dev_type(device) != GGML_BACKEND_DEVICE_TYPE_CPU) continue;
        using SetUseRef = void (*)(ggml_backend_t, bool);
        const auto set_use_ref = reinterpret_cast<SetUseRef>(
            ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(device), "ggml_backend_cpu_set_use_ref"));
        if (!set_use_ref) {
            throw UserError(ErrorKind::InvalidParameter,
                            "this ggml CPU backend has no ggml_backend_cpu_set_use_ref, so exact mode cannot "
                            "choose its kernels; install llama-cpp-python 0.3.36 or leave out --exact.");
        }
        set_use_ref(backend, true);
    }
}

// Whether the model's matrices are mostly F32, F16 or BF16 (general.file_type 0, 1 or 32): the
// types whose llamafile sgemm sums in another order than the one-row dot product.
bool has_sgemm_matrices(const Model& model) {
    const std::string file_type = model.metadata("general.file_type");
    return file_type == "0" || file_type == "1" || file_type == "32";
}

void run_decode(llama_context* ctx, llama_batch& batch, const std::vector<std::string>& rpc) {
    check_rpc_alive(rpc);  // a worker that hung up: an error here, not an abort inside ggml
    const int32_t rc = llama_decode(ctx, batch);
    if (rc != 0) {
        throw std::runtime_error("llama_decode failed with code " + std::to_string(rc) + ": " + take_last_error());
    }
}

struct Padding {
    int front = 0, back = 0;  // output rows added before / after the asked-for ones
    bool extra_token = false;  // a second row was added (its cache entry goes afterwards)
};

// Exact mode on a model with F16/BF16/F32 matrices: llama.cpp multiplies those by llamafile's
// sgemm from 2 rows on and by a one-row dot product otherwise, which sum in different orders.
// So no graph may hold a single row (a second one is added, the same token one position on,
// and removed from the cache afterwards), and no graph a single output row (the last layer
// after attention runs on output rows only: the row before the output row asks for logits too).
Padding pad_batch(llama_batch& batch) {
    Padding pad;
    const int n = batch.n_tokens;
    int outputs = 0;
    for (int j = 0; j < n; ++j) outputs += batch.logits[j] ? 1 : 0;
    if (n == 1) {
        batch.token[1] = batch.token[0];
        batch.pos[1] = batch.pos[0] + 1;
        batch.n_seq_id[1] = 1;
        batch.seq_id[1][0] = batch.seq_id[0][0];
        batch.logits[1] = batch.logits[0];
        batch.n_tokens = 2;
        pad.back = outputs;
        pad.extra_token = true;
    } else if (outputs == 1 && batch.logits[n - 1] && !batch.logits[n - 2]) {
        batch.logits[n - 2] = 1;
        pad.front = 1;
    }
    return pad;
}

ggml_type kv_cache_type(const std::string& name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const auto type = static_cast<ggml_type>(t);
        const char* type_name = ggml_type_name(type);
        if (type_name != nullptr && name == type_name) return type;
    }
    throw UserError(ErrorKind::InvalidParameter, "kv_type '" + name + "' is not a ggml type; use f16 or q8_0.");
}

}  // namespace

Context::Context(const Model& model, const ContextOptions& options) : impl_(std::make_unique<Impl>()) {
    llama_context_params params = llama_context_default_params();
    params.type_k = kv_cache_type(options.kv_type);
    params.type_v = params.type_k;
    params.flash_attn_type = options.flash_attn < 0    ? LLAMA_FLASH_ATTN_TYPE_AUTO
                             : options.flash_attn == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                       : LLAMA_FLASH_ATTN_TYPE_ENABLED;
    int threads = options.n_threads > 0 ? options.n_threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int n_seq = std::max(1, options.n_seq);
    params.n_ctx = static_cast<uint32_t>(options.n_ctx * n_seq);
    params.n_batch = static_cast<uint32_t>(std::min(options.n_batch, options.n_ctx));
    params.n_ubatch = std::min<uint32_t>(params.n_batch, 512);
    params.n_seq_max = static_cast<uint32_t>(n_seq);
    // Rows of several sequences in one graph (split_simple) need one cache for all of them;
    // exact mode gives each sequence a stream of its own (shares_passes()).
    params.kv_unified = !options.exact || n_seq == 1;
    // A GPU build computes a CPU-held layer's large batches (a prompt) on the GPU: exact mode
    // keeps every row on the CPU's reference kernels, or a prompt's rows get other bits there.
    params.op_offload = !options.exact;
    shares_passes_ = n_seq > 1 && params.kv_unified;
    params.n_threads = threads;
    params.n_threads_batch = threads;
    params.no_perf = true;
    // Speculation rolls the cache back by up to k positions. A sliding-window cache of
    // window size only (Gemma 3, Mistral) evicts old positions as new ones arrive, and after a
    // rollback those would be missing from the window: keep the full-size cache instead.
    params.swa_full = true;
    const bool recurrent = !model.can_drop_suffix();
    params.n_rs_seq = recurrent ? static_cast<uint32_t>(std::max(0, options.rollback_depth)) : 0;
    // Exact mode always computes the head (exact_head.h); the batched heads need AVX2 at least.
    impl_->fast_head = options.exact || (options.fast_head && !head_kernel_names().empty());
    impl_->hooks.fast_head = impl_->fast_head;
    impl_->hook.set_exact(options.exact);
    impl_->exact = options.exact;
    impl_->pad_rows = options.exact && has_sgemm_matrices(model);
    const bool hidden_states = !options.tap_layers.empty() || options.nextn_features;
    if (impl_->pad_rows && hidden_states) {
        throw UserError(ErrorKind::InvalidParameter,
                        "exact mode cannot yet feed a hidden-state drafter from an F16/BF16/F32 target (its "
                        "single rows are padded); use a quantized target or leave out --exact.");
    }
    kv_.assign(static_cast<size_t>(n_seq), {});
    features_.assign(static_cast<size_t>(n_seq), {});
    impl_->hooks.tap = layer_tap(model, options.tap_layers);
    if (impl_->fast_head || !impl_->hooks.tap.empty()) {
        params.cb_eval = on_target_node;
        params.cb_eval_user_data = &impl_->hooks;
    }
    impl_->n_threads = threads;
    impl_->rpc = model.impl_->rpc;
    check_rpc_alive(impl_->rpc);
    take_last_error();
    impl_->ctx = llama_init_from_model(model.impl_->model, params);
    if (!impl_->ctx) {
        std::string reason = take_last_error();
        throw UserError(ErrorKind::ModelLoad, "could not create a context of " +
                                                  std::to_string(options.n_ctx) + " tokens for '" +
                                                  model.path() + "': " + reason +
                                                  " (try a smaller --ctx)");
    }
    if (options.exact) use_reference_kernels(impl_->ctx);
    if (options.nextn_features) {
        impl_->nextn = require_nextn_ext();
        impl_->nextn.set(impl_->ctx, true, false);  // every row's hidden state, not only the outputs'
        feature_width_ = llama_model_n_embd_out(model.impl_->model);
    }
    impl_->n_batch = static_cast<int>(params.n_batch);
    impl_->n_ubatch = static_cast<int>(params.n_ubatch);
    impl_->batch = llama_batch_init(impl_->n_batch, 0, 1);
    // llama.cpp keeps no snapshots for the architectures that do not support them (n_rs_seq 0).
    if (recurrent) rollback_depth_ = static_cast<int>(llama_n_rs_seq(impl_->ctx));
    rollback_room_.assign(static_cast<size_t>(n_seq), 0);
    n_vocab_ = llama_vocab_n_tokens(model.impl_->vocab);
    if (impl_->fast_head || !impl_->hooks.tap.empty()) {
        // One token through the graph shows the hook the head (built at load) and proves that
        // the graph names the tapped layers.
        const Token bos = llama_vocab_bos(model.impl_->vocab);
        decode({bos >= 0 ? bos : 0}, 1);
        truncate(0);
    }
}

Context::~Context() = default;

int Context::n_ctx() const { return static_cast<int>(llama_n_ctx(impl_->ctx)) / n_seq(); }

void Context::decode(const std::vector<Token>& tokens, int n_logits, int seq,
                     const std::vector<std::vector<Token>>& only) {
    std::vector<Token>& kv = kv_.at(static_cast<size_t>(seq));
    const size_t n = tokens.size();
    // Exact mode decodes one llama.cpp graph (n_ubatch rows) per call, so that no graph of a
    // long input is left with the single row that would take other kernels (pad_batch).
    const size_t n_batch = static_cast<size_t>(impl_->exact ? impl_->n_ubatch : impl_->n_batch);
    if (n_logits > static_cast<int>(n_batch)) throw std::logic_error("more logits rows than n_batch");
    const size_t first_logit = n - std::min(n, static_cast<size_t>(std::max(n_logits, 0)));
    // The first piece takes the remainder so that the last piece is full and holds every row
    // that asks for logits (llama.cpp keeps only the last decode call's outputs).
    size_t end = 0;
    for (size_t start = 0; start < n; start = end) {
        end = start == 0 && n % n_batch != 0 ? n % n_batch : start + n_batch;
        llama_batch& batch = impl_->batch;
        batch.n_tokens = static_cast<int32_t>(end - start);
        for (size_t i = start; i < end; ++i) {
            const size_t j = i - start;
            batch.token[j] = tokens[i];
            batch.pos[j] = static_cast<llama_pos>(kv.size() + j);
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = seq;
            batch.logits[j] = i >= first_logit ? 1 : 0;
        }
        // The hook takes the rows of one graph: llama.cpp runs a graph per n_ubatch tokens, so
        // a piece longer than that (rows with logits could fall in two graphs) keeps llama.cpp's
        // head.
        const bool last = end == n;
        const Padding pad = impl_->pad_rows ? pad_batch(batch) : Padding{};
        const bool one_graph = batch.n_tokens <= impl_->n_ubatch;
        if (impl_->fast_head) impl_->hook.before_decode(last && one_graph && n > first_logit);
        run_decode(impl_->ctx, batch, impl_->rpc);
        if (pad.extra_token) llama_memory_seq_rm(llama_get_memory(impl_->ctx), seq, batch.pos[batch.n_tokens - 1], -1);
        if (last) impl_->padding = {pad.front, pad.back};
        kv.insert(kv.end(), tokens.begin() + static_cast<long>(start), tokens.begin() + static_cast<long>(end));
        kept_snapshots(seq, end - start);
        record_features({{seq, end - start}});
        record_nextn_features({{seq, end - start}});
    }
    n_logits_ = static_cast<int>(n - first_logit);
    const int captured = n_logits_ + impl_->padding.front + impl_->padding.back;
    std::vector<std::vector<Token>> hook_only;
    if (!only.empty()) {
        hook_only.resize(static_cast<size_t>(captured));
        for (size_t i = 0; i < only.size() && i < static_cast<size_t>(n_logits_); ++i) {
            hook_only[i + static_cast<size_t>(impl_->padding.front)] = only[i];
        }
    }
    impl_->used_head = impl_->fast_head && impl_->hook.after_decode(captured, n_vocab_, impl_->n_threads, hook_only);
}

void Context::decode_rows(const std::vector<SeqRows>& pieces) {
    if (pieces.size() == 1) {  // one sequence: decode() (exact mode's padding lives there)
        decode(pieces[0].tokens, static_cast<int>(pieces[0].tokens.size()), pieces[0].seq, pieces[0].only);
        return;
    }
    if (!shares_passes_) throw std::logic_error("this context's passes hold one sequence each");
    int total = 0;
    for (const SeqRows& piece : pieces) total += static_cast<int>(piece.tokens.size());
    if (total > impl_->n_batch) throw std::logic_error("more rows than n_batch in one pass");
    llama_batch& batch = impl_->batch;
    batch.n_tokens = total;
    int j = 0;
    for (const SeqRows& piece : pieces) {
        const size_t n_cached = kv_.at(static_cast<size_t>(piece.seq)).size();
        for (size_t i = 0; i < piece.tokens.size(); ++i, ++j) {
            batch.token[j] = piece.tokens[i];
            batch.pos[j] = static_cast<llama_pos>(n_cached + i);
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = piece.seq;
            batch.logits[j] = 1;
        }
    }
    if (impl_->fast_head) impl_->hook.before_decode(total <= impl_->n_ubatch);
    run_decode(impl_->ctx, batch, impl_->rpc);
    BatchLayout layout;
    for (const SeqRows& piece : pieces) {
        std::vector<Token>& kv = kv_.at(static_cast<size_t>(piece.seq));
        kv.insert(kv.end(), piece.tokens.begin(), piece.tokens.end());
        kept_snapshots(piece.seq, piece.tokens.size());
        layout.emplace_back(piece.seq, piece.tokens.size());
    }
    record_features(layout);
    record_nextn_features(layout);
    impl_->padding = {0, 0};
    n_logits_ = total;
    std::vector<std::vector<Token>> hook_only;  // the pieces' `only` in pass order, if any has one
    const bool any_only = std::any_of(pieces.begin(), pieces.end(), [](const SeqRows& p) { return !p.only.empty(); });
    for (const SeqRows& piece : pieces) {
        for (size_t i = 0; any_only && i < piece.tokens.size(); ++i) {
            hook_only.push_back(i < piece.only.size() ? piece.only[i] : std::vector<Token>{});
        }
    }
    impl_->used_head = impl_->fast_head && impl_->hook.after_decode(total, n_vocab_, impl_->n_threads, hook_only);
}

const char* Context::batch_head() const { return impl_->hook.name(); }

const char* Context::last_head() const { return impl_->used_head ? impl_->hook.name() : "llama.cpp"; }

int Context::last_chosen_rows() const { return impl_->used_head ? impl_->hook.chosen_rows() : 0; }

const float* Context::logits(int row) const {
    // Rows with logits are the last n_logits_ tokens of the last decode call; llama.cpp
    // indexes them by batch position, so count from the end of that (last) batch.
    if (row < 0 || row >= n_logits_) throw std::out_of_range("logits row out of range");
    if (impl_->used_head) return impl_->hook.logits(row + impl_->padding.front, n_vocab_);
    const float* out = llama_get_logits_ith(impl_->ctx, row - n_logits_ - impl_->padding.back);
    if (!out) throw std::runtime_error("llama.cpp returned no logits for row " + std::to_string(row));
    return out;
}

// A pass of n rows over a recurrent sequence leaves snapshots of its state 0 .. n-1 rows back
// (at most rollback_depth_): a rollback may drop up to n - 1 positions, and only until the
// next pass (llama.cpp marks the snapshot to start from, once).
void Context::kept_snapshots(int seq, size_t n_rows) {
    if (rollback_depth_ < 0) return;
    rollback_room_.at(static_cast<size_t>(seq)) = std::min(static_cast<size_t>(rollback_depth_), n_rows - 1);
}

bool Context::try_truncate(size_t n_keep, int seq) {
    std::vector<Token>& kv = kv_.at(static_cast<size_t>(seq));
    if (n_keep >= kv.size()) return true;
    // A recurrent state loses its last positions only through a snapshot. llama.cpp checks
    // the depth but not which pass wrote the snapshot, so the room is checked here. Removing
    // everything (from 0) always succeeds.
    const bool recurrent = rollback_depth_ >= 0;
    if (recurrent && n_keep > 0 && kv.size() - n_keep > rollback_room_.at(static_cast<size_t>(seq))) return false;
    if (!llama_memory_seq_rm(llama_get_memory(impl_->ctx), seq, static_cast<llama_pos>(n_keep), -1)) return false;
    if (recurrent) rollback_room_.at(static_cast<size_t>(seq)) = 0;
    kv.resize(n_keep);
    features_.at(static_cast<size_t>(seq)).truncate(n_keep, static_cast<size_t>(feature_width_));
    n_logits_ = 0;
    impl_->used_head = false;
    return true;
}

void Context::truncate(size_t n_keep, int seq) {
    if (try_truncate(n_keep, seq)) return;
    throw std::runtime_error("this model's memory cannot drop cached positions " + std::to_string(n_keep) + ".." +
                             std::to_string(kv_tokens(seq).size() - 1) +
                             " (a recurrent or hybrid model keeps one running state, and snapshots of it for "
                             "at most " + std::to_string(std::max(0, rollback_depth_)) +
                             " positions of its last pass), so it cannot take back these draft tokens; decode it "
                             "with the drafter 'none'.");
}

// Whether a decode's features are recorded (set_tapping). When not, the logs of its sequences
// restart after it: a log keeps only a contiguous run of recorded positions.
bool Context::recording(const BatchLayout& layout) {
    if (impl_->hooks.tapping) return true;
    for (const auto& [seq, n] : layout) features_.at(static_cast<size_t>(seq)).restart(kv_tokens(seq).size());
    return false;
}

// After a decode: the tap holds each tapped layer's rows for the batch's positions (in batch
// order: `layout`); interleave them into one row per position of its sequence.
void Context::record_features(const BatchLayout& layout) {
    GraphTap& tap = impl_->hooks.tap;
    if (tap.empty() || !recording(layout)) return;
    size_t total = 0;
    for (const auto& piece : layout) total += piece.second;
    std::vector<size_t> widths;
    for (size_t i = 0; i < tap.size(); ++i) {
        if (static_cast<size_t>(tap.n_rows(i)) != total) {
            throw UserError(ErrorKind::InvalidParameter,
                            "this target's graph does not show the hidden states a hidden-state drafter "
                            "reads (node 'l_out-N' missing); use another drafter for this model.");
        }
        widths.push_back(static_cast<size_t>(tap.width(i)));
    }
    size_t width = 0;
    for (size_t w : widths) width += w;
    feature_width_ = static_cast<int>(width);
    size_t r = 0;
    for (const auto& [seq, n] : layout) {
        FeatureLog& log = features_.at(static_cast<size_t>(seq));
        for (size_t k = 0; k < n; ++k, ++r) {
            for (size_t i = 0; i < tap.size(); ++i) log.append(tap.rows(i).data() + r * widths[i], 1, widths[i]);
        }
    }
    tap.clear();
}

// After a decode: llama.cpp's h_nextn rows, one per token of the batch, dense, in batch order.
void Context::record_nextn_features(const BatchLayout& layout) {
    if (!impl_->nextn.ok() || !recording(layout)) return;
    const float* rows = impl_->nextn.get(impl_->ctx);
    if (!rows) throw std::runtime_error("llama.cpp returned no final hidden states (h_nextn) for this decode");
    const auto width = static_cast<size_t>(feature_width_);
    for (const auto& [seq, n] : layout) {
        features_.at(static_cast<size_t>(seq)).append(rows, n, width);
        rows += n * width;
    }
}

void Context::set_tapping(bool on) {
    impl_->hooks.tapping = on;
    // Off, the target's last layer runs on the output rows only again.
    if (impl_->nextn.ok()) impl_->nextn.set(impl_->ctx, on, false);
}

const float* Context::features(size_t pos, int seq) const {
    const FeatureLog& log = features_.at(static_cast<size_t>(seq));
    const auto width = static_cast<size_t>(feature_width_);
    if (width == 0 || pos < log.begin() || pos >= log.end(width)) {
        throw std::out_of_range("no recorded features for position " + std::to_string(pos));
    }
    return log.row(pos, width);
}

void Context::drop_features_before(size_t pos, int seq) {
    features_.at(static_cast<size_t>(seq)).drop_before(pos, static_cast<size_t>(feature_width_));
}

size_t Context::common_prefix(const std::vector<Token>& tokens, int seq) const {
    const std::vector<Token>& kv = kv_tokens(seq);
    size_t common = 0;
    const size_t limit = std::min(tokens.size(), kv.size());
    while (common < limit && tokens[common] == kv[common]) ++common;
    return common;
}

size_t Context::sync(const std::vector<Token>& tokens, int n_logits, int seq) {
    // Rows that need logits must be recomputed even when cached.
    size_t common = std::min(common_prefix(tokens, seq),
                             tokens.size() - std::min(tokens.size(), static_cast<size_t>(n_logits)));
    if (!try_truncate(common, seq)) {
        common = 0;  // a recurrent state: start over
        truncate(0, seq);
    }
    if (common == tokens.size()) return 0;
    std::vector<Token> rest(tokens.begin() + static_cast<long>(common), tokens.end());
    decode(rest, n_logits, seq);
    return rest.size();
}

// ---- layer-input extraction ---------------------------------------------------------------

// The layer-input extraction that only some architectures publish (the tap's cross-check).
namespace {

struct LayerInputExt {
    void (*set)(llama_context*, uint32_t, bool) = nullptr;
    float* (*get)(llama_context*, uint32_t) = nullptr;
};

LayerInputExt layer_input_ext() {
    LayerInputExt ext;
    // void llama_set_embeddings_layer_inp(llama_context*, uint32_t, bool)
    ext.set = reinterpret_cast<decltype(ext.set)>(libllama_symbol("_Z30llama_set_embeddings_layer_inpP13llama_contextjb"));
    // float* llama_get_embeddings_layer_inp(llama_context*, uint32_t)
    ext.get = reinterpret_cast<decltype(ext.get)>(libllama_symbol("_Z30llama_get_embeddings_layer_inpP13llama_contextj"));
    if (!ext.set || !ext.get) {
        throw UserError(ErrorKind::InvalidParameter,
                        "this libllama does not export llama_set_embeddings_layer_inp / "
                        "llama_get_embeddings_layer_inp (llama-cpp-python 0.3.36 does); install that version.");
    }
    return ext;
}

}  // namespace

std::vector<float> tapped_layer_inputs(const Model& model, const std::vector<Token>& tokens,
                                       const std::vector<int>& layers) {
    ContextOptions options;
    options.n_ctx = std::max<int>(64, static_cast<int>(tokens.size()) + 1);
    options.tap_layers = layers;
    Context ctx(model, options);
    ctx.decode(tokens, 1);
    std::vector<float> out;
    for (size_t p = 0; p < tokens.size(); ++p) out.insert(out.end(), ctx.features(p), ctx.features(p) + ctx.feature_width());
    return out;
}

std::vector<float> extracted_layer_inputs(const Model& model, const std::vector<Token>& tokens,
                                          const std::vector<int>& layers) {
    const LayerInputExt ext = layer_input_ext();
    ContextOptions options;
    options.n_ctx = std::max<int>(64, static_cast<int>(tokens.size()) + 1);
    Context ctx(model, options);
    for (int il : layers) ext.set(ctx.impl_->ctx, static_cast<uint32_t>(il), true);
    ctx.decode(tokens, 1);
    const size_t n_embd = static_cast<size_t>(model.n_embd());
    std::vector<float> out;
    for (size_t row = 0; row < tokens.size(); ++row) {
        for (int il : layers) {
            const float* data = ext.get(ctx.impl_->ctx, static_cast<uint32_t>(il));
            out.insert(out.end(), data + row * n_embd, data + (row + 1) * n_embd);
        }
    }
    return out;
}

// ---- EAGLE-3 head context ---------------------------------------------------------------

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

}  // namespace

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

// ---- MTP context ----------------------------------------------------------------------------

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

// ---- quantization -----------------------------------------------------------------------

void quantize_model(const std::string& in_path, const std::string& out_path,
                    const std::string& type, int n_threads) {
    static const std::pair<const char*, llama_ftype> kTypes[] = {
        {"F32", LLAMA_FTYPE_ALL_F32},      {"F16", LLAMA_FTYPE_MOSTLY_F16},
        {"BF16", LLAMA_FTYPE_MOSTLY_BF16}, {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
        {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K}, {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
        {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"Q4_K_S", LLAMA_FTYPE_MOSTLY_Q4_K_S},
        {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0}, {"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0}, {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M},
        {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},
    };
    const llama_ftype* ftype = nullptr;
    std::string names;
    for (const auto& [name, value] : kTypes) {
        if (type == name) ftype = &value;
        names += names.empty() ? name : std::string(", ") + name;
    }
    if (!ftype) {
        throw UserError(ErrorKind::InvalidParameter,
                        "unknown quantization type '" + type + "'; use one of " + names + ".");
    }
    check_gguf_file(in_path);
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.ftype = *ftype;
    params.nthread = n_threads;
    params.allow_requantize = true;
    take_last_error();
    if (llama_model_quantize(in_path.c_str(), out_path.c_str(), &params) != 0) {
        throw UserError(ErrorKind::ModelLoad, "could not quantize '" + in_path + "': " + take_last_error());
    }
}

// ---- grammar ------------------------------------------------------------------------------

struct Grammar::Impl {
    llama_sampler* sampler = nullptr;
    std::vector<llama_token_data> buffer;  // the whole vocabulary, for mask()
    ~Impl() {
        if (sampler) llama_sampler_free(sampler);
    }
};

Grammar::Grammar(const Model& model, const std::string& gbnf) : impl_(std::make_unique<Impl>()) {
    take_last_error();
    impl_->sampler = llama_sampler_init_grammar(model.impl_->vocab, gbnf.c_str(), "root");
    if (!impl_->sampler) {
        std::string reason = take_last_error();
        while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
        throw UserError(ErrorKind::InvalidParameter, "the grammar does not parse" +
                                                         (reason.empty() ? std::string() : " (" + reason + ")") +
                                                         "; check its GBNF syntax (llama.cpp's grammars/README.md).");
    }
}

Grammar::~Grammar() = default;

std::unique_ptr<Grammar> Grammar::clone() const {
    std::unique_ptr<Grammar> out(new Grammar());
    out->impl_ = std::make_unique<Impl>();
    out->impl_->sampler = llama_sampler_clone(impl_->sampler);
    return out;
}

bool Grammar::allows(Token token) const {
    llama_token_data one{token, 0.0f, 0.0f};
    llama_token_data_array array{&one, 1, -1, false};
    llama_sampler_apply(impl_->sampler, &array);
    return one.logit != -INFINITY;
}

std::vector<Token> Grammar::allowed(const std::vector<Token>& candidates) const {
    auto& buffer = impl_->buffer;
    buffer.resize(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) buffer[i] = {candidates[i], 0.0f, 0.0f};
    llama_token_data_array array{buffer.data(), buffer.size(), -1, false};
    llama_sampler_apply(impl_->sampler, &array);
    std::vector<Token> out;
    for (size_t i = 0; i < array.size; ++i) {
        if (array.data[i].logit != -INFINITY) out.push_back(array.data[i].id);
    }
    return out;
}

void Grammar::mask(float* logits, int n_vocab) {
    auto& buffer = impl_->buffer;
    buffer.resize(static_cast<size_t>(n_vocab));
    for (int i = 0; i < n_vocab; ++i) buffer[static_cast<size_t>(i)] = {i, 0.0f, 0.0f};
    llama_token_data_array array{buffer.data(), buffer.size(), -1, false};
    llama_sampler_apply(impl_->sampler, &array);
    for (size_t i = 0; i < array.size; ++i) {
        if (array.data[i].logit == -INFINITY) logits[array.data[i].id] = -INFINITY;
    }
}

void Grammar::accept(Token token) { llama_sampler_accept(impl_->sampler, token); }

}  // namespace localspec
