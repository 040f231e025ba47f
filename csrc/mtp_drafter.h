// MTP drafting: the target's own NextN layers draft from its final hidden states (docs/design.md,
// "Hidden-state drafting"). One more implementation of the drafter interface.
#pragma once

#include <string>
#include <vector>

#include "drafter.h"
#include "llama_backend.h"

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
// committed at once).
class MtpDrafter : public Drafter {
public:
    MtpDrafter(const Model& target_model, Context& target, int n_threads, bool sample, float p_min);
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

private:
    void commit(const std::vector<Token>& history, size_t n_commit);
    Token next_token(const SamplingParams& params, Rng& rng, bool sampled, Draft& out);

    Context& target_;
    MtpContext ctx_;
    bool sample_;
    float p_min_;
    size_t committed_ = 0;     // entries 0 .. committed_-1 are made from target states
    std::vector<Token> seen_;  // the history those entries were made from (h[0..committed_-1])
    std::vector<float> h_;
};

}  // namespace localspec
