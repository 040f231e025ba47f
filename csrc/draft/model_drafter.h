// The draft-model drafter: a second, smaller GGUF of the target's vocabulary in a context of its
// own, one pass per drafted token.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "llama/llama_backend.h"

namespace localspec {

// A smaller GGUF of the same vocabulary. Greedy (argmax of q) at temperature 0 or when
// `sample` is false; otherwise samples each draft token from the warped q. Drafting stops
// early when the draft is unsure (its most likely token has probability below p_min): such
// tokens are rarely accepted and each costs a draft pass and a verification row.
class ModelDrafter : public Drafter {
public:
    ModelDrafter(std::shared_ptr<Model> model, const ContextOptions& options, int max_token, bool sample,
                 float p_min);
    std::string name() const override { return model_->path(); }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    bool has_model() const override { return true; }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return draft(history, k, params, rng);
    }
    // The rows the cache lacks beyond the first pass's one or two, at the learned seconds a row.
    double catch_up_seconds(const std::vector<Token>& history) const override;
    void select(int slot) override { slot_ = slot; }
    void rollback(const std::vector<Token>& history) override;
    void prefill(const std::vector<Token>& history) override;
    std::string head() const override { return ctx_.batch_head(); }

private:
    std::shared_ptr<Model> model_;
    Context ctx_;  // one sequence per slot (ContextOptions::n_seq)
    int slot_ = 0;
    int max_token_;  // drafts must be valid target ids: stop before a larger id
    bool sample_;
    float p_min_;  // confidence cutoff: stop drafting below this top probability
    // Seconds a row of a long catch-up (a batch of kLearnRows rows or more: the prompt, the
    // tokens emitted while another kind drafted) costs: smoothed over those passes.
    double row_seconds_ = 0;
    size_t sync(const std::vector<Token>& tokens, int n_logits);  // ctx_.sync, learning row_seconds_
};

}  // namespace localspec
