// Model: loading a GGUF (with its RPC placement and localspec's body kernels) and reading its
// vocabulary and metadata.
#include "llama/llama_backend.h"

#include <llama.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"
#include "kernels/body_matmul.h"
#include "llama/impl.h"
#include "rpc/rpc.h"

namespace localspec {

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

namespace {

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

int Model::n_layer() const { return llama_model_n_layer(impl_->model); }

int Model::n_embd() const { return llama_model_n_embd(impl_->model); }

std::string Model::architecture() const { return metadata("general.architecture"); }

std::string Model::memory_kind() const {
    if (llama_model_is_hybrid(impl_->model)) return "hybrid";
    if (llama_model_is_recurrent(impl_->model)) return "recurrent";
    return "attention";
}

}  // namespace localspec
