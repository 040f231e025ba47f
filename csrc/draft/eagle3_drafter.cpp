#include "draft/eagle3_drafter.h"

#include <algorithm>

#include "base/errors.h"
#include "sample/sampling.h"

namespace localspec {

namespace {

constexpr size_t kMaxBacklogBytes = size_t{64} << 20;  // target features waiting for the head

}  // namespace

Eagle3Drafter::Eagle3Drafter(std::shared_ptr<Model> head, Context& target, int n_threads, bool sample, float p_min,
                             int slot, std::shared_ptr<const DraftVocabHead> vocab)
    : head_(std::move(head)),
      target_(target),
      ctx_(*head_, target, n_threads),
      vocab_(vocab ? std::move(vocab) : std::make_shared<const DraftVocabHead>(head_->path(), target.n_vocab())),
      slot_(slot),
      n_threads_(n_threads),
      sample_(sample),
      p_min_(p_min) {
    head_name_ = "localspec (" + std::to_string(vocab_->n_draft()) + "-token draft vocabulary)";
    if (vocab_->n_embd() != ctx_.n_embd()) {
        throw UserError(ErrorKind::ModelLoad, "the EAGLE-3 head '" + head_->path() +
                                                  "' has an output layer of the wrong width; convert it again.");
    }
}

// Make the head hold entries 0 .. n_commit-1 from the target's features (entry P needs the
// features at P, which the target recorded, and h[P + 1]). Positions whose features were already
// dropped (a new request that rewrote an old prefix) get zero features: a weaker draft there,
// never a wrong output.
void Eagle3Drafter::commit(const std::vector<Token>& history, size_t n_commit) {
    const size_t from = static_cast<size_t>(ctx_.n_positions());
    if (from >= n_commit) return;
    const int rows = static_cast<int>(n_commit - from);
    const size_t width = static_cast<size_t>(target_.feature_width());
    features_.assign(static_cast<size_t>(rows) * width, 0.0f);
    for (size_t p = std::max(from, target_.features_begin(slot_)); p < n_commit; ++p) {
        std::copy_n(target_.features(p, slot_), width, features_.begin() + static_cast<long>((p - from) * width));
    }
    ctx_.encode(features_.data(), rows, static_cast<int>(width), g_);
    ctx_.decode(history.data() + from + 1, g_.data(), rows);
    committed_ = n_commit;
    seen_.assign(history.begin(), history.begin() + static_cast<long>(n_commit + 1));
    target_.drop_features_before(n_commit - 1, slot_);  // keep the seed's: a draft may remake it
}

// Entries stay valid while the history they were made from does (entry P read h[0..P + 1]).
void Eagle3Drafter::rollback(const std::vector<Token>& history) {
    size_t common = 0;
    while (common < seen_.size() && common < history.size() && seen_[common] == history[common]) ++common;
    committed_ = std::min(committed_, common > 0 ? common - 1 : 0);
    seen_.resize(std::min(seen_.size(), committed_ + 1));
    const size_t backlog = target_.kv_tokens(slot_).size() - std::max(committed_, target_.features_begin(slot_));
    const size_t width = static_cast<size_t>(std::max(1, target_.feature_width()));
    if (backlog * width * sizeof(float) > kMaxBacklogBytes && !history.empty()) {
        ctx_.truncate(static_cast<int>(committed_));
        commit(history, std::min(history.size() - 1, target_.kv_tokens(slot_).size()));
    }
}

// The next draft token from the head's newest entry: the argmax over the draft vocabulary, or a
// sample from q there (q is 0 outside it); -1 when the head is unsure (top probability below
// p_min). Returned and recorded as target ids (through d2t).
Token Eagle3Drafter::next_token(const SamplingParams& params, Rng& rng, bool sampled, Draft& out) {
    const int n_draft = static_cast<int>(vocab_->n_draft());
    logits_.resize(static_cast<size_t>(n_draft));
    vocab_->compute(ctx_.normed(ctx_.n_rows() - 1), logits_.data(), n_threads_);
    if (!sampled) {
        const Token best = argmax(logits_.data(), n_draft);
        if (p_min_ > 0 && top_probability(logits_.data(), n_draft, best) < p_min_) return -1;
        return vocab_->target_id(best);
    }
    Distribution q = warp(logits_.data(), n_draft, params);
    if (q.probs.front() < p_min_) return -1;
    const Token id = sample(q, rng);
    for (Token& t : q.ids) t = vocab_->target_id(t);
    out.q.push_back(std::move(q));
    return vocab_->target_id(id);
}

Draft Eagle3Drafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    Draft out;
    out.kind = DraftKind::head();
    const size_t n = history.size();
    // The target's cache holds h[0..n-2], so their features are recorded.
    if (k <= 0 || n < 2 || target_.kv_tokens(slot_).size() + 1 < n) return out;
    const bool sampled = sample_ && !params.greedy();
    // Drop the previous draft's speculative entries and any made from a different history, then
    // commit up to the seed entry n-2 (always recomputed here: its output gives d_1).
    rollback(history);
    committed_ = std::min(committed_, n - 2);
    ctx_.truncate(static_cast<int>(committed_));
    commit(history, n - 1);
    for (int i = 0; i < k && ctx_.n_positions() < target_.n_ctx(); ++i) {
        const Token token = next_token(params, rng, sampled, out);
        if (token < 0) break;
        out.tokens.push_back(token);
        if (i + 1 == k) break;
        // Entry n-1+i: (d_{i+1}, the pre-norm state the previous entry ended in).
        const float* state = ctx_.prenorm(ctx_.n_rows() - 1);
        g_.assign(state, state + ctx_.n_embd());
        ctx_.decode(&token, g_.data(), 1);
    }
    return out;
}

}  // namespace localspec
