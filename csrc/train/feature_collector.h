// What `localspec train-head` reads from a target (docs/train-head.md): per position, the hidden
// states an EAGLE-3 head reads (the inputs of three layers, through Context's graph tap, as the
// drafter gets them) and the target's greedy next token; and the target's token embeddings,
// dequantized as llama.cpp's get_rows does (the head borrows them). Plain C++, no pybind11.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "llama/llama_backend.h"

namespace localspec {

class FeatureCollector {
public:
    // Throws UserError when the target cannot be loaded or its graph does not show the layers.
    FeatureCollector(const std::string& path, const std::vector<int>& layers, int n_ctx, int n_threads);

    const Model& model() const { return *model_; }
    int feature_width() const { return static_cast<int>(layers_.size()) * model_->n_embd(); }
    int n_ctx() const { return ctx_->n_ctx(); }

    // Run the target over `tokens` from an empty cache (at most n_ctx() of them): features gets
    // tokens.size() rows of feature_width() floats (row p: the tapped layers' inputs at p) and
    // argmax tokens.size() ids (argmax[p]: the target's greedy choice after tokens[0..p]).
    void collect(const std::vector<Token>& tokens, std::vector<float>& features, std::vector<Token>& argmax);

private:
    std::shared_ptr<Model> model_;
    std::unique_ptr<Context> ctx_;
    std::vector<int> layers_;
    int chunk_ = 64;  // rows per decode: every row asks for logits (rows x n_vocab floats)
};

// Rows `ids` of the GGUF's token_embd.weight as floats (ggml's own dequantization), row-major
// [ids.size() x n_embd]. Throws UserError when the file has no such tensor or an id is out of range.
std::vector<float> token_embedding_rows(const std::string& path, const std::vector<Token>& ids);

}  // namespace localspec
