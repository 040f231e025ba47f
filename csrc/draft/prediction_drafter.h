// Predicted Outputs (docs/design.md, "Predicted outputs"): the request brings its own draft of
// the output, such as the file before an edit, and the drafter proposes what the prediction says
// comes next. Free to propose, and lossless like every draft: the target verifies each token.
// One more implementation of the drafter interface; without a prediction it is `next`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"

namespace localspec {

// Where a generation's output stands in its prediction.
//
// Invariant: `cursor` is the index of the prediction token expected next, and while `synced`
// the output's last token was prediction[cursor - 1] (or the output is still empty, with
// cursor 0). When the output departs from the prediction (an edit inserts, deletes or changes
// text) it is no longer synced, and after each later token the alignment looks for where the
// output rejoins the prediction: the longest suffix of the output that occurs in the
// prediction, at the occurrence nearest the cursor. An inserted or deleted line costs the
// tokens of the change plus a token or two to rejoin; drafting then goes on for the rest.
class PredictionAlignment {
public:
    PredictionAlignment() = default;
    PredictionAlignment(int generation, size_t prompt_length) : generation_(generation), prompt_length_(prompt_length) {}

    int generation() const { return generation_; }
    // Reads the output tokens of `history` not followed yet. Between calls a history only
    // grows (rolled-back drafts never enter it); the prediction is always the same one.
    void follow(const std::vector<Token>& prediction, const std::vector<Token>& history);
    // Up to k prediction tokens to follow the output; empty while the output has not rejoined
    // the prediction, or at its end.
    std::vector<Token> continuation(const std::vector<Token>& prediction, int k) const;
    bool synced() const { return synced_; }
    size_t cursor() const { return cursor_; }
    // How many of the output's last tokens follow the prediction at the cursor: those matched
    // in a row since the output last departed, or the length of the match it rejoined at.
    // kMinAnywhere at the start: the prediction is the client's own claim about the output.
    int evidence() const { return evidence_; }

    // Rejoining: suffixes shorter than kMinAnywhere tokens count only within kNear tokens of
    // the cursor (a renamed identifier's next token is likely the prediction's there, and
    // likely chance elsewhere); suffixes longer than kMaxSuffix tokens match no better.
    static constexpr int kMaxSuffix = 12;
    static constexpr int kMinAnywhere = 3;
    static constexpr size_t kNear = 24;

private:
    void rejoin(const std::vector<Token>& prediction, const Token* output, size_t n_output);

    int generation_ = -1;
    size_t prompt_length_ = 0;
    size_t seen_ = 0;    // output tokens followed so far
    size_t cursor_ = 0;  // the prediction token expected next
    bool synced_ = true;
    int evidence_ = kMinAnywhere;
};

// The prediction's continuation when the output follows it, else `next`'s proposal; where the
// output has only just rejoined the prediction (on fewer than kMinAnywhere tokens), `next`'s
// free proposal wins when its n-gram match is longer. One alignment per generation slot
// (batched serving), started afresh for each new generation.
class PredictionDrafter : public ChainedDrafter {
public:
    explicit PredictionDrafter(std::unique_ptr<Drafter> next) : ChainedDrafter(std::move(next)) {}
    void begin_draft(const DraftInputs& inputs) override;
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    Draft lookup_draft(const std::vector<Token>& history, int k) override;
    void select(int slot) override;

private:
    // The prediction's proposal after `history` (empty: none), and how many output tokens back
    // it (PredictionAlignment::evidence).
    Draft propose(const std::vector<Token>& history, int k, int& evidence) const;

    std::vector<PredictionAlignment> slots_;  // [slot]: its generation's alignment
    size_t slot_ = 0;
    // The generation about to draft: its prediction (null: none) and its emitted history's length.
    const std::vector<Token>* prediction_ = nullptr;
    size_t history_length_ = 0;
};

}  // namespace localspec
