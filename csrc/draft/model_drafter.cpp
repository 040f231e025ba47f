// The draft-model drafter: keeping its cache in step with the history, and drafting token by
// token (greedy or sampled, stopping when unsure).
#include "draft/model_drafter.h"

#include <algorithm>
#include <utility>

#include "base/clock.h"

namespace localspec {

ModelDrafter::ModelDrafter(std::shared_ptr<Model> model, const ContextOptions& options, int max_token, bool sample,
                           float p_min)
    : model_(std::move(model)), ctx_(*model_, options), max_token_(max_token), sample_(sample), p_min_(p_min) {}

namespace {
constexpr size_t kLearnRows = 8;   // catch-ups this long teach row_seconds_ (a pass's fixed part is small in them)
constexpr size_t kFirstPassRows = 2;  // a drafting step's own catch-up: the correction, and the last draft when all were kept
constexpr double kRowSmoothing = 0.3;
}  // namespace

size_t ModelDrafter::sync(const std::vector<Token>& tokens, int n_logits) {
    const auto t0 = Clock::now();
    const size_t rows = ctx_.sync(tokens, n_logits, slot_);
    if (rows >= kLearnRows) {
        const double per_row = seconds_since(t0) / static_cast<double>(rows);
        row_seconds_ = row_seconds_ == 0 ? per_row : row_seconds_ + kRowSmoothing * (per_row - row_seconds_);
    }
    return rows;
}

// A draft step brings the cache up to the history in its first pass; the one or two rows a
// drafting step leaves behind cost what any draft pass costs (the controller's cost per token),
// the rows beyond them are the catch-up.
double ModelDrafter::catch_up_seconds(const std::vector<Token>& history) const {
    const size_t lag = history.size() - std::min(history.size(), ctx_.common_prefix(history, slot_));
    return lag > kFirstPassRows ? static_cast<double>(lag - kFirstPassRows) * row_seconds_ : 0.0;
}

void ModelDrafter::prefill(const std::vector<Token>& history) {
    if (history.size() > 1) sync(std::vector<Token>(history.begin(), history.end() - 1), 0);
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
    sync(history, 1);
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

}  // namespace localspec
