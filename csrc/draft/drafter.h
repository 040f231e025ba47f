// Drafters propose tokens for the target to verify. One interface, several strategies:
// a second GGUF model, n-gram lookup over the context, or nothing (plain decoding).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "draft/draft_kind.h"
#include "llama/llama_backend.h"
#include "sample/sampling.h"

namespace localspec {

struct Draft {
    std::vector<Token> tokens;
    // One distribution per drafted token when the drafter sampled from q; empty for a
    // deterministic drafter (q is then a point mass on each drafted token).
    std::vector<Distribution> q;
    DraftKind kind;
    // A chained draft: its first `forced` tokens are text the request's grammar forces (kind
    // DraftKind::forced()); `kind` is that of the tokens after them.
    int forced = 0;
    // Where the grammar forces text: row_candidates[i] (i <= forced) holds every token the
    // grammar can allow at row i (after d_1..d_i), a few hundred at most, or is empty (not
    // known). Verification computes the target's logits of these tokens alone there. Valid
    // for any shorter draft too: a row's candidates depend only on the drafts before it.
    std::vector<std::vector<Token>> row_candidates;
};

class Drafter {
public:
    virtual ~Drafter() = default;
    virtual std::string name() const = 0;
    // The grammar of the generation about to draft, in its state after that generation's history
    // (null when it has none); valid until the draft returns. Most drafters do not read it. Not
    // timed as drafting: one-time tables may be built here.
    virtual void begin_draft(const Grammar* /*grammar*/) {}
    // Propose up to k tokens to follow `history` (prompt + everything emitted so far).
    virtual Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) = 0;
    // The two halves of draft() for the controller. lookup_draft: what costs (almost) nothing
    // to propose (n-gram lookup), so the engine takes the longest proposal and lets the
    // controller decide how much of it to verify. model_draft: what a draft model proposes,
    // a pass per token, so its length is chosen first.
    virtual Draft lookup_draft(const std::vector<Token>& /*history*/, int /*k*/) { return {}; }
    virtual bool has_model() const { return false; }
    // The kind of draft model_draft returns (the controller's choice of its length comes first).
    virtual DraftKind model_kind() const { return DraftKind::model(); }
    virtual Draft model_draft(const std::vector<Token>& /*history*/, int /*k*/, const SamplingParams& /*params*/,
                              Rng& /*rng*/) {
        return {};
    }
    // The generation the next calls concern, by its cache slot (batched serving: several
    // generations take turns). A drafter that keeps a cache keeps one per slot.
    virtual void select(int /*slot*/) {}
    // The step kept only `history`: drop any state that went beyond it (KV rollback).
    virtual void rollback(const std::vector<Token>& /*history*/) {}
    // Process the prompt before generation starts, so drafting time excludes prefill.
    virtual void prefill(const std::vector<Token>& /*history*/) {}
    // Which head computes a draft model's logits (Context::batch_head()); "" when the drafter
    // runs no model.
    virtual std::string head() const { return ""; }
};

// Prompt lookup: find the most recent earlier occurrence of the last n tokens (longest n
// first, from n_max down to n_min) and propose what followed it.
class NgramDrafter : public Drafter {
public:
    NgramDrafter(int n_min, int n_max) : n_min_(n_min), n_max_(n_max) {}
    std::string name() const override { return "ngram"; }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    Draft lookup_draft(const std::vector<Token>& history, int k) override;

private:
    int n_min_;
    int n_max_;
};

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
};

// One drafter per generation slot, each made when its slot first comes up (batched serving
// with a drafter whose state follows one generation: an EAGLE-3 head's or MTP layers' context).
// Every call goes to the selected slot's drafter.
class PerSlotDrafter : public Drafter {
public:
    using Factory = std::function<std::unique_ptr<Drafter>(int slot)>;
    PerSlotDrafter(int n_slots, Factory make);
    std::string name() const override { return slots_[0]->name(); }
    void select(int slot) override;
    void begin_draft(const Grammar* grammar) override { current().begin_draft(grammar); }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return current().draft(history, k, params, rng);
    }
    Draft lookup_draft(const std::vector<Token>& history, int k) override { return current().lookup_draft(history, k); }
    bool has_model() const override { return slots_[0]->has_model(); }
    DraftKind model_kind() const override { return slots_[0]->model_kind(); }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return current().model_draft(history, k, params, rng);
    }
    void rollback(const std::vector<Token>& history) override { current().rollback(history); }
    void prefill(const std::vector<Token>& history) override { current().prefill(history); }
    std::string head() const override { return slots_[0]->head(); }

private:
    Drafter& current() { return *slots_[static_cast<size_t>(slot_)]; }
    Factory make_;
    std::vector<std::unique_ptr<Drafter>> slots_;
    int slot_ = 0;
};

// n-gram lookup when the context has a match (free, and often long when the output copies
// the prompt), a drafter that runs a model otherwise (a draft model or an EAGLE-3 head).
class HybridDrafter : public Drafter {
public:
    HybridDrafter(NgramDrafter ngram, std::unique_ptr<Drafter> model, std::string name)
        : ngram_(std::move(ngram)), model_(std::move(model)), name_(std::move(name)) {}
    std::string name() const override { return name_; }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    Draft lookup_draft(const std::vector<Token>& history, int k) override { return ngram_.lookup_draft(history, k); }
    bool has_model() const override { return true; }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return model_->draft(history, k, params, rng);
    }
    void select(int slot) override { model_->select(slot); }
    void rollback(const std::vector<Token>& history) override { model_->rollback(history); }
    void prefill(const std::vector<Token>& history) override { model_->prefill(history); }
    std::string head() const override { return model_->head(); }
    DraftKind model_kind() const override { return model_->model_kind(); }

private:
    NgramDrafter ngram_;
    std::unique_ptr<Drafter> model_;
    std::string name_;
};

}  // namespace localspec
