#include "train/feature_collector.h"

#include <ggml.h>
#include <gguf.h>

#include <cstring>
#include <fstream>

#include "base/errors.h"
#include "sample/sampling.h"

namespace localspec {

FeatureCollector::FeatureCollector(const std::string& path, const std::vector<int>& layers, int n_ctx,
                                   int n_threads)
    : model_(std::make_shared<Model>(ModelOptions{path, 0})), layers_(layers) {
    ContextOptions options;
    options.n_ctx = n_ctx;
    options.n_batch = chunk_;
    options.n_threads = n_threads;
    options.fast_head = true;  // the head the engine verifies with: the same greedy choices
    options.tap_layers = layers;
    ctx_ = std::make_unique<Context>(*model_, options);
}

void FeatureCollector::collect(const std::vector<Token>& tokens, std::vector<float>& features,
                               std::vector<Token>& argmax_out) {
    if (tokens.size() > static_cast<size_t>(ctx_->n_ctx())) {
        throw UserError(ErrorKind::InvalidParameter, "a training sequence of " + std::to_string(tokens.size()) +
                                                         " tokens does not fit the collector's context of " +
                                                         std::to_string(ctx_->n_ctx()) + " tokens.");
    }
    ctx_->truncate(0);
    features.clear();
    argmax_out.clear();
    const size_t width = static_cast<size_t>(feature_width());
    features.reserve(tokens.size() * width);
    for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(chunk_)) {
        const size_t end = std::min(tokens.size(), start + static_cast<size_t>(chunk_));
        const std::vector<Token> piece(tokens.begin() + static_cast<long>(start), tokens.begin() + static_cast<long>(end));
        ctx_->decode(piece, static_cast<int>(piece.size()));
        for (size_t row = 0; row < piece.size(); ++row) {
            argmax_out.push_back(argmax(ctx_->logits(static_cast<int>(row)), ctx_->n_vocab()));
        }
        for (size_t p = start; p < end; ++p) {
            const float* f = ctx_->features(p);
            features.insert(features.end(), f, f + width);
        }
        ctx_->drop_features_before(end);
    }
}

std::vector<float> token_embedding_rows(const std::string& path, const std::vector<Token>& ids) {
    ggml_context* meta = nullptr;
    gguf_init_params params{true, &meta};
    gguf_context* gguf = gguf_init_from_file(path.c_str(), params);
    if (!gguf) throw UserError(ErrorKind::ModelLoad, "could not read '" + path + "' as a GGUF file; check the path.");
    struct Closer {
        gguf_context* g;
        ggml_context* m;
        ~Closer() {
            gguf_free(g);
            if (m) ggml_free(m);
        }
    } closer{gguf, meta};
    const ggml_tensor* t = ggml_get_tensor(meta, "token_embd.weight");
    if (!t) {
        throw UserError(ErrorKind::ModelLoad, "'" + path + "' has no token_embd.weight tensor, which an EAGLE-3 "
                                                           "head borrows; train a head for another model.");
    }
    const int64_t n_embd = t->ne[0];
    const size_t row_bytes = ggml_row_size(t->type, n_embd);
    const ggml_to_float_t to_float = ggml_get_type_traits(t->type)->to_float;
    if (t->type != GGML_TYPE_F32 && !to_float) {
        throw UserError(ErrorKind::ModelLoad, "the token embeddings of '" + path + "' have a type localspec cannot read.");
    }
    const size_t base = gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, gguf_find_tensor(gguf, t->name));
    std::ifstream file(path, std::ios::binary);
    std::vector<uint8_t> raw(row_bytes);
    std::vector<float> out(ids.size() * static_cast<size_t>(n_embd));
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= t->ne[1]) {
            throw UserError(ErrorKind::InvalidParameter, "token id " + std::to_string(ids[i]) +
                                                             " is outside the vocabulary of '" + path + "'.");
        }
        file.seekg(static_cast<std::streamoff>(base + static_cast<size_t>(ids[i]) * row_bytes));
        file.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(row_bytes));
        if (!file) throw UserError(ErrorKind::ModelLoad, "'" + path + "' is truncated; copy it again.");
        float* dst = out.data() + i * static_cast<size_t>(n_embd);
        if (t->type == GGML_TYPE_F32) std::memcpy(dst, raw.data(), row_bytes);
        else to_float(raw.data(), dst, n_embd);
    }
    return out;
}

}  // namespace localspec
