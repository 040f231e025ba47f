// The prediction drafter: aligning the output with the request's prediction, and proposing
// the prediction's continuation.
#include "draft/prediction_drafter.h"

#include <algorithm>

namespace localspec {

// ---- alignment ------------------------------------------------------------------------------

void PredictionAlignment::follow(const std::vector<Token>& prediction, const std::vector<Token>& history) {
    if (history.size() < prompt_length_) return;
    const Token* output = history.data() + prompt_length_;
    const size_t n_output = history.size() - prompt_length_;
    if (n_output <= seen_) return;
    for (; seen_ < n_output; ++seen_) {
        if (synced_ && cursor_ < prediction.size() && prediction[cursor_] == output[seen_]) {
            ++cursor_;
            ++evidence_;
        } else {
            synced_ = false;  // the output departs here; it may rejoin at any later token
        }
    }
    if (!synced_) rejoin(prediction, output, n_output);
}

// The best occurrence of an output suffix in the prediction: the longest (up to kMaxSuffix
// tokens), and among those the nearest the cursor, ahead of it preferred (an output goes back
// in its prediction only when an edit repeats earlier text). One scan over the prediction's
// end positions e: match(e) is the length of the common suffix of prediction[0, e) and the
// output. The cursor then moves to e, the prediction token after the match.
void PredictionAlignment::rejoin(const std::vector<Token>& prediction, const Token* output, size_t n_output) {
    const size_t longest = std::min(static_cast<size_t>(kMaxSuffix), n_output);
    size_t best_match = 0, best_end = 0, best_distance = 0;
    for (size_t end = 1; end <= prediction.size(); ++end) {
        size_t match = 0;
        while (match < longest && match < end && prediction[end - 1 - match] == output[n_output - 1 - match]) ++match;
        if (match == 0) continue;
        const size_t distance = end >= cursor_ ? end - cursor_ : 2 * (cursor_ - end);
        if (match < static_cast<size_t>(kMinAnywhere) && distance > kNear) continue;
        if (match > best_match || (match == best_match && distance < best_distance)) {
            best_match = match;
            best_end = end;
            best_distance = distance;
        }
    }
    if (best_match == 0) return;
    cursor_ = best_end;
    synced_ = true;
    evidence_ = static_cast<int>(best_match);
}

std::vector<Token> PredictionAlignment::continuation(const std::vector<Token>& prediction, int k) const {
    if (!synced_ || k <= 0 || cursor_ >= prediction.size()) return {};
    const size_t n = std::min(static_cast<size_t>(k), prediction.size() - cursor_);
    const auto from = prediction.begin() + static_cast<long>(cursor_);
    return std::vector<Token>(from, from + static_cast<long>(n));
}

// ---- the drafter ------------------------------------------------------------------------------

void PredictionDrafter::select(int slot) {
    slot_ = static_cast<size_t>(std::max(0, slot));
    if (slots_.size() <= slot_) slots_.resize(slot_ + 1);
    next_->select(slot);
}

// A new generation in the slot starts a new alignment; the tokens emitted since the last draft
// are followed here, so a draft whose history runs beyond them (a grammar-forced lead) only
// follows its own tokens on a copy.
void PredictionDrafter::begin_draft(const DraftInputs& inputs) {
    const bool has = inputs.prediction && !inputs.prediction->empty() && inputs.history;
    prediction_ = has ? inputs.prediction : nullptr;
    if (prediction_) {  // select() made the slot's alignment
        PredictionAlignment& alignment = slots_[slot_];
        if (alignment.generation() != inputs.generation) alignment = PredictionAlignment(inputs.generation, inputs.prompt_length);
        alignment.follow(*prediction_, *inputs.history);
        history_length_ = inputs.history->size();
    }
    next_->begin_draft(inputs);
}

Draft PredictionDrafter::propose(const std::vector<Token>& history, int k, int& evidence) const {
    Draft out;
    if (!prediction_ || k <= 0) return out;
    out.kind = DraftKind::prediction();
    PredictionAlignment alignment = slots_[slot_];
    if (history.size() > history_length_) alignment.follow(*prediction_, history);  // a lead's drafts
    out.tokens = alignment.continuation(*prediction_, k);
    evidence = alignment.evidence();
    return out;
}

Draft PredictionDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    int evidence = 0;
    Draft out = propose(history, k, evidence);
    return out.tokens.empty() ? next_->draft(history, k, params, rng) : out;
}

Draft PredictionDrafter::lookup_draft(const std::vector<Token>& history, int k) {
    int evidence = 0;
    Draft out = propose(history, k, evidence);
    if (!out.tokens.empty() && evidence >= PredictionAlignment::kMinAnywhere) return out;
    Draft other = next_->lookup_draft(history, k);
    if (out.tokens.empty()) return other;
    const bool longer = !other.tokens.empty() && other.kind.match_length > evidence;
    return longer ? other : out;
}

}  // namespace localspec
