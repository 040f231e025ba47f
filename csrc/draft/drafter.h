// Drafters propose tokens for the target to verify. One interface (this header); one
// implementation a file:
//   NgramDrafter (ngram_drafter.h): n-gram lookup over the context (prompt lookup), no model;
//   ModelDrafter (model_drafter.h): a second, smaller GGUF of the same vocabulary;
//   Eagle3Drafter (eagle3_drafter.h): an EAGLE-3 head reading the target's hidden states;
//   MtpDrafter (mtp_drafter.h): the target's own MTP (NextN) layers;
//   ForcedDrafter (forced_drafter.h): the text the request's grammar forces, then another drafter;
//   PredictionDrafter (prediction_drafter.h): the request's own prediction of its output (an
//   edit's original text), then another drafter;
//   HybridDrafter and PerSlotDrafter (combinators.h): n-gram lookup first, else a drafter that runs
//   a model; one drafter per generation slot.
// No drafter at all is plain decoding (the drafter "none"). The engine builds them
// (engine.cpp, make_drafter).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "draft/draft_kind.h"
#include "llama/llama_backend.h"
#include "sample/sampling.h"

namespace localspec {

// A proposal: the drafted tokens, how they were drawn, and who proposed them.
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
    // The part of the draft's seconds paid once before its first token (a draft model's
    // catch-up over tokens it had not seen), as priced when its length was chosen: the
    // controller learns the cost per token without it.
    double setup_seconds = 0;
};

// What the generation about to draft brings of its own, beyond its history: valid until the
// draft returns.
struct DraftInputs {
    int generation = -1;               // the generation's id (unique in the engine's lifetime)
    const Grammar* grammar = nullptr;  // its grammar in its state after the history, or null
    const std::vector<Token>* prediction = nullptr;  // its prediction of its output, or null
    // Its history (prompt + emitted tokens): history[0 .. prompt_length) is the prompt, the
    // rest its output. A draft's `history` may run further (a grammar-forced lead drafted
    // before it); this one holds only tokens the target emitted.
    const std::vector<Token>* history = nullptr;
    size_t prompt_length = 0;
};

class Drafter {
public:
    virtual ~Drafter() = default;
    // What drafts, for the user (SpecEngine::drafter_name): "ngram", "mtp", a path, ...
    virtual std::string name() const = 0;
    // The generation about to draft (its grammar, its prediction). Most drafters do not read
    // it. Not timed as drafting: one-time tables may be built here.
    virtual void begin_draft(const DraftInputs& /*inputs*/) {}
    // Propose up to k tokens to follow `history` (prompt + everything emitted so far).
    virtual Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) = 0;
    // The two halves of draft() for the controller. lookup_draft: what costs (almost) nothing
    // to propose (n-gram lookup), so the engine takes the longest proposal and lets the
    // controller decide how much of it to verify. model_draft: what a draft model proposes,
    // a pass per token, so its length is chosen first.
    virtual Draft lookup_draft(const std::vector<Token>& /*history*/, int /*k*/) { return {}; }
    // Whether the drafter runs a model (a draft GGUF, a head, MTP layers) for model_draft.
    virtual bool has_model() const { return false; }
    // Seconds model_draft would spend, before its first token's pass, bringing its cache up to
    // `history` (the tokens emitted while it did not draft), as the drafter estimates them.
    virtual double catch_up_seconds(const std::vector<Token>& /*history*/) const { return 0; }
    // The kind of draft model_draft returns (the controller's choice of its length comes first).
    virtual DraftKind model_kind() const { return DraftKind::model(); }
    // The model half of draft() (see lookup_draft); empty from a drafter that runs no model.
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

// A drafter in front of another (`next`): every call goes to `next` unless the subclass
// overrides it (ForcedDrafter, PredictionDrafter propose first and hand over to `next`).
class ChainedDrafter : public Drafter {
public:
    explicit ChainedDrafter(std::unique_ptr<Drafter> next) : next_(std::move(next)) {}
    std::string name() const override { return next_->name(); }
    void begin_draft(const DraftInputs& inputs) override { next_->begin_draft(inputs); }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return next_->draft(history, k, params, rng);
    }
    Draft lookup_draft(const std::vector<Token>& history, int k) override { return next_->lookup_draft(history, k); }
    bool has_model() const override { return next_->has_model(); }
    double catch_up_seconds(const std::vector<Token>& history) const override {
        return next_->catch_up_seconds(history);
    }
    DraftKind model_kind() const override { return next_->model_kind(); }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return next_->model_draft(history, k, params, rng);
    }
    void select(int slot) override { next_->select(slot); }
    void rollback(const std::vector<Token>& history) override { next_->rollback(history); }
    void prefill(const std::vector<Token>& history) override { next_->prefill(history); }
    std::string head() const override { return next_->head(); }

protected:
    std::unique_ptr<Drafter> next_;
};

}  // namespace localspec
