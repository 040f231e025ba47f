#include "draft/eagle3_head.h"

#include <ggml-cpu.h>
#include <ggml.h>
#include <gguf.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>

#include "base/errors.h"
#include "kernels/head_common.h"

namespace localspec {

namespace {

// A GGUF opened for metadata and tensor layout (no tensor data loaded).
struct GgufFile {
    std::string path;
    gguf_context* gguf = nullptr;
    ggml_context* meta = nullptr;

    explicit GgufFile(const std::string& p) : path(p) {
        gguf_init_params params{true, &meta};
        gguf = gguf_init_from_file(p.c_str(), params);
        if (!gguf) throw UserError(ErrorKind::ModelLoad, "could not read '" + p + "' as a GGUF file; check the path.");
    }
    ~GgufFile() {
        if (gguf) gguf_free(gguf);
        if (meta) ggml_free(meta);
    }
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    int64_t key(const std::string& name) const { return gguf_find_key(gguf, name.c_str()); }
    std::string str(const std::string& name) const {
        const int64_t k = key(name);
        return k >= 0 && gguf_get_kv_type(gguf, k) == GGUF_TYPE_STRING ? gguf_get_val_str(gguf, k) : "";
    }
    ggml_tensor* tensor(const char* name) const { return ggml_get_tensor(meta, name); }
    std::vector<uint8_t> data(const ggml_tensor* t) const {
        const int64_t id = gguf_find_tensor(gguf, t->name);
        std::vector<uint8_t> out(ggml_nbytes(t));
        std::ifstream file(path, std::ios::binary);
        file.seekg(static_cast<std::streamoff>(gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, id)));
        file.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
        if (!file) throw UserError(ErrorKind::ModelLoad, "'" + path + "' is truncated; copy it again.");
        return out;
    }
};

int64_t int_value(const gguf_context* g, int64_t k) {
    switch (gguf_get_kv_type(g, k)) {
        case GGUF_TYPE_UINT32: return gguf_get_val_u32(g, k);
        case GGUF_TYPE_INT32: return gguf_get_val_i32(g, k);
        case GGUF_TYPE_UINT64: return static_cast<int64_t>(gguf_get_val_u64(g, k));
        case GGUF_TYPE_INT64: return gguf_get_val_i64(g, k);
        default: return -1;
    }
}

std::vector<int> int_array(const gguf_context* g, int64_t k) {
    std::vector<int> out;
    if (k < 0 || gguf_get_kv_type(g, k) != GGUF_TYPE_ARRAY) return out;
    const size_t n = gguf_get_arr_n(g, k);
    const void* data = gguf_get_arr_data(g, k);
    const gguf_type type = gguf_get_arr_type(g, k);
    for (size_t i = 0; i < n; ++i) {
        if (type == GGUF_TYPE_INT32) out.push_back(static_cast<const int32_t*>(data)[i]);
        else if (type == GGUF_TYPE_UINT32) out.push_back(static_cast<int>(static_cast<const uint32_t*>(data)[i]));
    }
    return out;
}

}  // namespace

std::optional<Eagle3Info> read_eagle3_info(const std::string& path) {
    std::optional<GgufFile> opened;
    try {
        opened.emplace(path);
    } catch (const UserError&) {
        return std::nullopt;  // not readable as a GGUF: the model loader says why
    }
    const GgufFile& file = *opened;
    if (file.str("general.architecture") != "eagle3") return std::nullopt;
    Eagle3Info info;
    info.target_layers = int_array(file.gguf, file.key("eagle3.target_layers"));
    const int64_t hidden = file.key("eagle3.target_hidden_size");
    const int64_t width = file.key("eagle3.embedding_length");
    info.target_hidden = hidden >= 0 ? static_cast<int>(int_value(file.gguf, hidden)) : 0;
    info.n_embd = width >= 0 ? static_cast<int>(int_value(file.gguf, width)) : 0;
    if (info.target_layers.size() != 3 || info.target_hidden <= 0 || info.n_embd <= 0) {
        throw UserError(ErrorKind::ModelLoad, "the EAGLE-3 head '" + path +
                                                  "' lacks eagle3.target_layers (3 layers), target_hidden_size "
                                                  "or embedding_length; convert it again with localspec convert-head.");
    }
    return info;
}

void check_head_fits(const std::string& path, const Eagle3Info& info, const Model& target) {
    if (info.target_hidden != target.n_embd()) {
        throw UserError(ErrorKind::InvalidParameter,
                        "the EAGLE-3 head '" + path + "' was made for a target of hidden size " +
                            std::to_string(info.target_hidden) + ", but '" + target.path() + "' has " +
                            std::to_string(target.n_embd()) + "; use a head made for this target.");
    }
    for (int il : info.target_layers) {
        if (il < 1 || il >= target.n_layer()) {
            throw UserError(ErrorKind::InvalidParameter,
                            "the EAGLE-3 head '" + path + "' reads layer " + std::to_string(il) + ", but '" +
                                target.path() + "' has layers 0.." + std::to_string(target.n_layer() - 1) +
                                " (and localspec reads from layer 1 on); use a head made for this target.");
        }
    }
}

DraftVocabHead::DraftVocabHead(const std::string& path, int n_target_vocab) {
    GgufFile file(path);
    const ggml_tensor* out = file.tensor("output.weight");
    if (!out) {
        throw UserError(ErrorKind::ModelLoad, "the EAGLE-3 head '" + path +
                                                  "' has no output layer of its own; localspec needs one "
                                                  "(over a draft vocabulary with a d2t map).");
    }
    n_embd_ = static_cast<int>(out->ne[0]);
    n_draft_ = out->ne[1];
    // d2t: absolute target ids; without it the draft vocabulary is the target's.
    if (const ggml_tensor* d2t = file.tensor("d2t")) {
        const std::vector<uint8_t> raw = file.data(d2t);
        const auto* ids = reinterpret_cast<const int64_t*>(raw.data());
        for (int64_t i = 0; i < d2t->ne[0]; ++i) d2t_.push_back(static_cast<Token>(ids[i]));
    } else {
        for (int64_t i = 0; i < n_draft_; ++i) d2t_.push_back(static_cast<Token>(i));
    }
    for (Token id : d2t_) {
        if (id < 0 || id >= n_target_vocab || d2t_.size() != static_cast<size_t>(n_draft_)) {
            throw UserError(ErrorKind::VocabMismatch,
                            "the EAGLE-3 head '" + path + "' maps its draft vocabulary to token ids outside the "
                            "target's vocabulary of " + std::to_string(n_target_vocab) +
                            "; use a head made for this target.");
        }
    }
    // Pack the rows for ggml's CPU dot products: Q8_0 (as llama.cpp quantizes activations for
    // Q8_0 weights) when the width is a multiple of its 32-value block, F32 otherwise.
    ggml_cpu_init();
    type_ = n_embd_ % 32 == 0 ? GGML_TYPE_Q8_0 : GGML_TYPE_F32;
    const auto packed = static_cast<ggml_type>(type_);
    row_bytes_ = ggml_row_size(packed, n_embd_);
    const std::vector<uint8_t> raw = file.data(out);
    const ggml_to_float_t to_float = ggml_get_type_traits(out->type)->to_float;
    const ggml_from_float_t from_float = ggml_get_type_traits_cpu(packed)->from_float;
    std::vector<float> row(static_cast<size_t>(n_embd_));
    rows_.resize(row_bytes_ * static_cast<size_t>(n_draft_));
    const size_t in_bytes = ggml_row_size(out->type, n_embd_);
    for (int64_t r = 0; r < n_draft_; ++r) {
        const uint8_t* src = raw.data() + static_cast<size_t>(r) * in_bytes;
        if (out->type == GGML_TYPE_F32) std::memcpy(row.data(), src, in_bytes);
        else if (to_float) to_float(src, row.data(), n_embd_);
        else throw UserError(ErrorKind::ModelLoad, "the EAGLE-3 head's output layer has a type localspec cannot read.");
        uint8_t* dst = rows_.data() + static_cast<size_t>(r) * row_bytes_;
        if (packed == GGML_TYPE_F32) std::memcpy(dst, row.data(), row_bytes_);
        else from_float(row.data(), dst, n_embd_);
    }
    hidden_.resize(row_bytes_);
}

void DraftVocabHead::compute(const float* normed, float* logits, int n_threads) const {
    const auto packed = static_cast<ggml_type>(type_);
    const auto* traits = ggml_get_type_traits_cpu(packed);
    if (packed == GGML_TYPE_F32) std::memcpy(hidden_.data(), normed, row_bytes_);
    else ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float(normed, hidden_.data(), n_embd_);
    const uint8_t* h = hidden_.data();
    split_over_threads(n_draft_, n_threads, [&](int64_t first, int64_t last) {
        for (int64_t r = first; r < last; ++r) {
            traits->vec_dot(n_embd_, logits + r, 0, rows_.data() + static_cast<size_t>(r) * row_bytes_, 0, h, 0, 1);
        }
    });
}

}  // namespace localspec
