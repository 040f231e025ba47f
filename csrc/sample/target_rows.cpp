#include "sample/target_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace localspec {

namespace {
// How many of a row's best tokens are checked against the grammar before the whole vocabulary
// is (constrained_argmax, constrained_warp): a few, then a wider set. A wide check costs about
// its share of a whole mask (4096 of 262,144 tokens: ~1/64); a grammar that allows only rare
// tokens at a point (the end of generation once it is complete, one word of a list) usually
// has one among the wider set.
constexpr int64_t kTopCandidates = 128;
constexpr int64_t kWideCandidates = 4096;

// The stages' sizes for a vocabulary of n_vocab, each at least `least`, growing, at most n_vocab.
std::vector<int> stages(int n_vocab, int64_t least) {
    std::vector<int> out;
    for (int64_t n : {kTopCandidates, kWideCandidates}) {
        const int size = static_cast<int>(std::min<int64_t>(n_vocab, std::max(n, least)));
        if (out.empty() || size > out.back()) out.push_back(size);
    }
    return out;
}

// The next stage: extends `allowed`, the allowed tokens among the row's best `checked` in argmax
// order, to its best n. top_tokens(n) begins with top_tokens(checked) (one total order: logit,
// then id), so only the new ones are checked. Returns the n-th best logit, which bounds every
// token outside them (-infinity when there is none).
float allow_best(const float* logits, int n_vocab, int n, Grammar& grammar, size_t& checked,
                 std::vector<Token>& allowed) {
    const std::vector<Token> top = top_tokens(logits, n_vocab, n);
    const std::vector<Token> fresh = grammar.allowed(std::vector<Token>(top.begin() + static_cast<long>(checked), top.end()));
    allowed.insert(allowed.end(), fresh.begin(), fresh.end());
    checked = top.size();
    return n == n_vocab ? -INFINITY : logits[top.back()];
}
}  // namespace

TargetRows::TargetRows(const Context& target, int first_row, const std::vector<Token>& history,
                       const std::vector<Token>& drafts, const SamplingParams& params, Grammar* grammar,
                       const std::vector<std::vector<Token>>* candidates)
    : target_(target), first_row_(first_row), drafts_(drafts), params_(params), grammar_(grammar),
      candidates_(candidates) {
    if (params.penalized()) {
        const size_t n = params.penalty_last_n < 0 ? history.size()
                                                   : std::min(history.size(), static_cast<size_t>(params.penalty_last_n));
        window_.assign(history.end() - static_cast<long>(n), history.end());
    }
}

void TargetRows::advance_to(size_t i) {
    while (row_ < i) {
        const Token d = drafts_[row_];
        if (grammar_) grammar_->accept(d);  // row_'s rule accepted d, so the grammar allows it
        if (params_.penalized()) window_.push_back(d);
        ++row_;
    }
}

const float* TargetRows::penalized(size_t i) {
    advance_to(i);
    const float* raw = target_.logits(first_row_ + static_cast<int>(i));
    if (!params_.penalized()) return raw;
    buffer_.assign(raw, raw + target_.n_vocab());
    apply_penalties(buffer_.data(), target_.n_vocab(), window_, params_);
    return buffer_.data();
}

// Plain decoding masks the whole row to the allowed tokens A after the penalties: the same
// values at A, -infinity elsewhere, which is what this builds from A's logits alone (every
// penalty leaves -infinity as it is).
const float* TargetRows::from_candidates(size_t i) {
    if (!grammar_ || !candidates_ || i >= candidates_->size() || (*candidates_)[i].empty()) return nullptr;
    advance_to(i);
    const std::vector<Token> allowed = grammar_->allowed((*candidates_)[i]);
    if (allowed.empty()) throw std::logic_error("the grammar allows none of a forced row's candidates");
    const float* raw = target_.logits(first_row_ + static_cast<int>(i));
    buffer_.assign(static_cast<size_t>(target_.n_vocab()), -INFINITY);
    for (Token t : allowed) buffer_[static_cast<size_t>(t)] = raw[t];
    apply_penalties(buffer_.data(), target_.n_vocab(), window_, params_);
    return buffer_.data();
}

// The row with every token the grammar forbids at -infinity: the whole vocabulary checked (the
// expensive fallback of constrained_argmax and constrained_warp). `logits` may be buffer_ itself.
const float* TargetRows::masked(const float* logits) {
    const int n_vocab = target_.n_vocab();
    if (logits != buffer_.data()) buffer_.assign(logits, logits + n_vocab);
    grammar_->mask(buffer_.data(), n_vocab);
    return buffer_.data();
}

Token TargetRows::argmax(size_t i) {
    if (const float* shaped = from_candidates(i)) return localspec::argmax(shaped, target_.n_vocab());
    const float* logits = penalized(i);
    const Token best = localspec::argmax(logits, target_.n_vocab());
    // The constrained argmax is the unconstrained one whenever the grammar allows it.
    if (!grammar_ || grammar_->allows(best)) return best;
    return constrained_argmax(logits);
}

// The best token the grammar allows: the first allowed among the row's best tokens (a stage of
// stages()), in argmax's order (higher logit, then lower id). Any token outside them ranks after
// every one of them in that order (a lower logit, or the last one's logit and a higher id than
// each of its ties among them), so the first allowed one is the masked row's argmax. When no
// stage holds an allowed token the whole vocabulary is masked (~25-170 ms on a 262k vocabulary).
Token TargetRows::constrained_argmax(const float* logits) {
    const int n_vocab = target_.n_vocab();
    std::vector<Token> allowed;
    size_t checked = 0;
    for (int n : stages(n_vocab, 0)) {
        allow_best(logits, n_vocab, n, *grammar_, checked, allowed);
        if (!allowed.empty()) return allowed[0];
    }
    return localspec::argmax(masked(logits), n_vocab);
}

Distribution TargetRows::warped(size_t i) {
    if (const float* shaped = from_candidates(i)) return warp(shaped, target_.n_vocab(), params_);
    const float* logits = penalized(i);
    if (!grammar_) return warp(logits, target_.n_vocab(), params_);
    return constrained_warp(logits);
}

// warp() of the masked row, from the grammar's verdict on the row's best tokens (a stage of
// stages(), at least 4 x top_k) when that decides it (warp_known: top-k or min-p leave out every
// token not checked), else from the whole vocabulary masked. With llama.cpp's defaults (top_k
// 40, min_p 0.05) rows inside a JSON string or between its fields are decided by their best
// 160 tokens; a full mask costs ~25 ms for a JSON grammar on a 262k vocabulary.
Distribution TargetRows::constrained_warp(const float* logits) {
    const int n_vocab = target_.n_vocab();
    std::vector<Token> allowed;
    size_t checked = 0;
    for (int n : stages(n_vocab, int64_t{4} * params_.top_k)) {
        const float bound = allow_best(logits, n_vocab, n, *grammar_, checked, allowed);
        Distribution out;
        if (warp_known(logits, allowed, bound, params_, out)) return out;
    }
    return warp(masked(logits), n_vocab, params_);
}

void TargetRows::emit(Token token) {
    if (grammar_) grammar_->accept(token);
}

}  // namespace localspec
