#include "draft/drafter.h"

#include <algorithm>
#include <cmath>

namespace localspec {

// ---- n-gram -------------------------------------------------------------------------------

namespace {

// The continuation after the most recent earlier occurrence of the last n tokens of
// `context` (longest n first); empty when nothing matches. `n_found` gets the match length.
std::vector<Token> lookup(const std::vector<Token>& context, int n_min, int n_max, int k, int& n_found) {
    const int len = static_cast<int>(context.size());
    for (int n = std::min(n_max, len - 1); n >= n_min; --n) {
        const Token* suffix = context.data() + (len - n);
        // Scan backwards: the most recent match best predicts the local continuation.
        for (int start = len - n - 1; start >= 0; --start) {
            if (!std::equal(suffix, suffix + n, context.data() + start)) continue;
            const int from = start + n;
            const int count = std::min(k, len - from);
            n_found = n;
            return std::vector<Token>(context.begin() + from, context.begin() + from + count);
        }
    }
    return {};
}

}  // namespace

Draft NgramDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams&, Rng&) {
    return lookup_draft(history, k);
}

Draft NgramDrafter::lookup_draft(const std::vector<Token>& history, int k) {
    Draft out;
    if (k <= 0) return out;
    int n_found = 0;
    out.tokens = lookup(history, n_min_, n_max_, k, n_found);
    out.kind = DraftKind::lookup(n_found);
    // A match whose continuation runs into the end of the context is a repeating cycle:
    // keep looking up on the context extended by the draft, so the draft follows the cycle.
    std::vector<Token> context;
    while (!out.tokens.empty() && static_cast<int>(out.tokens.size()) < k) {
        if (context.empty()) context = history;
        context.resize(history.size());
        context.insert(context.end(), out.tokens.begin(), out.tokens.end());
        int n_more = 0;
        std::vector<Token> more = lookup(context, n_max_, n_max_, k - static_cast<int>(out.tokens.size()), n_more);
        if (more.empty()) break;
        out.tokens.insert(out.tokens.end(), more.begin(), more.end());
    }
    return out;
}

// ---- draft model --------------------------------------------------------------------------

ModelDrafter::ModelDrafter(std::shared_ptr<Model> model, const ContextOptions& options, int max_token, bool sample,
                           float p_min)
    : model_(std::move(model)), ctx_(*model_, options), max_token_(max_token), sample_(sample), p_min_(p_min) {}

void ModelDrafter::prefill(const std::vector<Token>& history) {
    if (history.size() > 1) ctx_.sync(std::vector<Token>(history.begin(), history.end() - 1), 0, slot_);
}

void ModelDrafter::rollback(const std::vector<Token>& history) {
    ctx_.truncate(ctx_.common_prefix(history, slot_), slot_);
}

Draft ModelDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    Draft out;
    if (k <= 0 || history.empty()) return out;
    const bool sampled = sample_ && !params.greedy();
    // Invariant on entry to each iteration: the draft cache holds history + drafted tokens,
    // and logits(0) is q for the next position.
    ctx_.sync(history, 1, slot_);
    for (int i = 0; i < k; ++i) {
        if (ctx_.kv_tokens(slot_).size() >= static_cast<size_t>(ctx_.n_ctx())) break;
        const float* logits = ctx_.logits(0);
        std::vector<float> penalized;  // q shaped like p: the same penalties over the same window
        if (params.penalized()) {
            penalized.assign(logits, logits + ctx_.n_vocab());
            std::vector<Token> context = history;
            context.insert(context.end(), out.tokens.begin(), out.tokens.end());
            apply_penalties(penalized.data(), ctx_.n_vocab(), context, params);
            logits = penalized.data();
        }
        Token token;
        if (sampled) {
            Distribution q = warp(logits, ctx_.n_vocab(), params);
            if (q.probs.front() < p_min_) break;
            token = sample(q, rng);
            out.q.push_back(std::move(q));
        } else {
            token = argmax(logits, ctx_.n_vocab());
            if (p_min_ > 0 && top_probability(logits, ctx_.n_vocab(), token) < p_min_) break;
        }
        if (token >= max_token_) {
            if (sampled) out.q.pop_back();
            break;
        }
        out.tokens.push_back(token);
        if (i + 1 < k) ctx_.decode({token}, 1, slot_);
    }
    return out;
}

// ---- one per slot -------------------------------------------------------------------------

PerSlotDrafter::PerSlotDrafter(int n_slots, Factory make) : make_(std::move(make)) {
    slots_.resize(static_cast<size_t>(std::max(1, n_slots)));
    slots_[0] = make_(0);  // the first one answers name(), head() and model_kind()
}

void PerSlotDrafter::select(int slot) {
    std::unique_ptr<Drafter>& drafter = slots_.at(static_cast<size_t>(slot));
    if (!drafter) drafter = make_(slot);
    slot_ = slot;
}

// ---- hybrid -------------------------------------------------------------------------------

Draft HybridDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    Draft out = ngram_.draft(history, k, params, rng);
    if (!out.tokens.empty()) return out;  // the model's cache catches up on its next draft
    return model_->draft(history, k, params, rng);
}

}  // namespace localspec
