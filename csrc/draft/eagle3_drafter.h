// EAGLE-3 drafting: a one-layer head that reads the target's hidden states (docs/design.md,
// "Hidden-state drafting"). One more implementation of the drafter interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "draft/eagle3_head.h"
#include "llama/llama_backend.h"

namespace localspec {

// The head's memory holds one entry per target position P: (token P + 1, g_P), g_P = fc(the
// target's features at P). To draft after history h[0..n-1] (the target has processed h[0..n-2]
// and recorded their features), the entry at n-2 pairs h[n-1] with g_{n-2}; its output gives
// d_1. Entry n-2+i pairs d_i with the head's own state from the previous entry (its pre-norm
// output, standing in for the target's g) and gives d_{i+1}. Entries made from target features
// are committed; the speculative ones are dropped before the next draft. Entries are committed
// lazily, when the head next drafts, so a head the controller keeps off costs only the copies
// of the target's features (bounded: a backlog over kMaxBacklogBytes is committed at once).
class Eagle3Drafter : public Drafter {
public:
    // `slot`: the target sequence whose features it reads (one drafter per generation slot in
    // batched serving, sharing the head's output-layer copy `vocab`; null: load it).
    Eagle3Drafter(std::shared_ptr<Model> head, Context& target, int n_threads, bool sample, float p_min,
                  int slot = 0, std::shared_ptr<const DraftVocabHead> vocab = nullptr);
    const std::shared_ptr<const DraftVocabHead>& vocab() const { return vocab_; }
    std::string name() const override { return "eagle3:" + head_->path(); }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    bool has_model() const override { return true; }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return draft(history, k, params, rng);
    }
    void rollback(const std::vector<Token>& history) override;
    void prefill(const std::vector<Token>& history) override { rollback(history); }
    std::string head() const override { return head_name_; }
    DraftKind model_kind() const override { return DraftKind::head(); }

private:
    void commit(const std::vector<Token>& history, size_t n_commit);
    Token next_token(const SamplingParams& params, Rng& rng, bool sampled, Draft& out);

    std::shared_ptr<Model> head_;
    Context& target_;
    HeadContext ctx_;
    std::shared_ptr<const DraftVocabHead> vocab_;
    int slot_;
    int n_threads_;
    bool sample_;
    float p_min_;
    std::string head_name_;
    size_t committed_ = 0;  // entries 0 .. committed_-1 are made from target features
    std::vector<Token> seen_;  // the history those entries were made from (h[0..committed_])
    std::vector<float> features_, g_, logits_;
};

}  // namespace localspec
