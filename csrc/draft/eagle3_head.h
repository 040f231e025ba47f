// What localspec reads from an EAGLE-3 head's GGUF itself, with ggml's gguf reader (no
// llama.h): which target layers it reads, and its output layer with the d2t map, so that draft
// logits are computed over the head's own vocabulary (a few thousand rows) with quantized dot
// products, rather than by llama.cpp's F16 layer scattered into the target's whole vocabulary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llama/llama_backend.h"

namespace localspec {

struct Eagle3Info {
    std::vector<int> target_layers;  // the target layers whose inputs the head reads
    int target_hidden = 0;  // the target's hidden size the head was made for
    int n_embd = 0;  // the head's own width
};

// The head's metadata when `path` is a GGUF of architecture "eagle3"; nullopt for any other
// file (unreadable ones too: the model loader says why). Throws UserError when an eagle3 file
// lacks what a head needs. One read of the header answers both questions.
std::optional<Eagle3Info> read_eagle3_info(const std::string& path);
// Throws UserError (one sentence) when the head at `path` cannot read `target`'s hidden states.
void check_head_fits(const std::string& path, const Eagle3Info& info, const Model& target);

// The head's output layer over its draft vocabulary: logits for draft id i (target id
// target_id(i)) from one normalised state row.
class DraftVocabHead {
public:
    DraftVocabHead(const std::string& path, int n_target_vocab);
    int64_t n_draft() const { return n_draft_; }
    int n_embd() const { return n_embd_; }
    Token target_id(int64_t i) const { return d2t_[static_cast<size_t>(i)]; }
    void compute(const float* normed, float* logits, int n_threads) const;

private:
    int n_embd_ = 0;
    int64_t n_draft_ = 0;
    int type_ = 0;  // ggml_type of the packed rows: Q8_0 when the width allows, else F32
    size_t row_bytes_ = 0;
    std::vector<uint8_t> rows_;
    std::vector<Token> d2t_;
    mutable std::vector<uint8_t> hidden_;  // the state row in the dot product's type
};

}  // namespace localspec
