// MTP drafting: the target's own NextN layers draft from its final hidden states (docs/design.md,
// "Hidden-state drafting"). One more implementation of the drafter interface.
#pragma once

#include <string>
#include <vector>

#include "draft/drafter.h"
#include "llama/llama_backend.h"

namespace localspec {

// Why the GGUF at `path` cannot draft with its MTP layers in this build (no NextN layers, their
// tensors left out by the conversion, an architecture whose MTP graph localspec has not taken
// on, memory that cannot drop a suffix, a libllama without the extension functions); "" when it
// can. One sentence, for the user.
std::string mtp_unsupported(const std::string& path);

// The MTP context holds one entry per target position q: (token q, h_{q-1}), h being the
// target's final hidden state (zeros before position 0). To draft after history h[0..n-1] (the
// target has processed h[0..n-2] and recorded their states), entries up to the seed n-1 are
// made from the target's states; the seed's output gives d_1. Entry n-1+i pairs d_i with the
// MTP layers' own state from the previous entry and gives d_{i+1}. Entries made from target
// states are committed; the speculative ones are dropped before the next draft. Entries are
// committed lazily, when the layers next draft, so while the controller keeps them off they
// cost only the copies of the target's states (bounded: a backlog over kMaxBacklogBytes is
// committed at once). A model with several NextN layers (hy_v3) drafts position i with layer i,
// as llama.cpp's chained MTP drafter does: every layer holds the committed entries, and layer i
// reads the chain (d_1, s_0) .. (d_i, s_{i-1}), s_j being layer j's output state; a draft then
// has at most as many tokens as there are layers.
class MtpDrafter : public Drafter {
public:
    // `slot`: the target sequence whose states it reads (one drafter per generation slot in
    // batched serving).
    MtpDrafter(const Model& target_model, Context& target, int n_threads, bool sample, float p_min, int slot = 0);
    std::string name() const override { return "mtp"; }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    bool has_model() const override { return true; }
    DraftKind model_kind() const override { return DraftKind::mtp(); }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return draft(history, k, params, rng);
    }
    void rollback(const std::vector<Token>& history) override;
    void prefill(const std::vector<Token>& history) override { rollback(history); }
    std::string head() const override { return "llama.cpp"; }
    int n_layers() const { return ctx_.n_layers(); }
    // The seed entry's logits after `history` (the distribution of the first draft token, from
    // layer 0), committing the entries before it: what draft() starts from.
    const float* seed_logits(const std::vector<Token>& history);

private:
    void commit(const std::vector<Token>& history, size_t n_commit);
    void extend(const std::vector<Token>& drafted, size_t n);
    Token next_token(const SamplingParams& params, Rng& rng, bool sampled, Draft& out);

    Context& target_;
    MtpContext ctx_;
    int slot_;
    bool sample_;
    float p_min_;
    size_t committed_ = 0;     // entries 0 .. committed_-1 are made from target states
    std::vector<Token> seen_;  // the history those entries were made from (h[0..committed_-1])
    std::vector<float> h_;
    std::vector<float> chain_;  // the states s_0 .. s_i the draft's entries read
};

// Layer 0's logits for every position of `tokens` (row j: the first draft token after
// tokens[0..j]), computed the way the drafter computes them: `localspec check`'s diagnostic.
std::vector<float> mtp_first_logits(const std::string& target_path, const std::vector<Token>& tokens, int n_threads);

}  // namespace localspec
