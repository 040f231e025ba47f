// The target's rows of one verification batch, shaped as plain decoding shapes them at the
// same positions: the penalties over the window that ends there (history + the drafts before
// the row) and the grammar in its state there. Row i is what the target alone would see after
// emitting d_1..d_i, so the acceptance rules stay lossless with respect to the shaped target.
#pragma once

#include <vector>

#include "llama/llama_backend.h"
#include "sample/sampling.h"

namespace localspec {

class TargetRows {
public:
    // Row i is the target's logits row first_row + i (a pass may hold other sequences' rows).
    // `grammar` may be null (unconstrained); it advances over the drafts as rows are read and
    // must outlive this object, as must `candidates` (Draft::row_candidates, or null): where
    // its entry i is not empty, the grammar allows no token outside it at row i, and row i's
    // logits are read at those tokens alone.
    TargetRows(const Context& target, int first_row, const std::vector<Token>& history, const std::vector<Token>& drafts,
               const SamplingParams& params, Grammar* grammar,
               const std::vector<std::vector<Token>>* candidates = nullptr);

    // Rows are read in increasing order, each once (as the acceptance rules walk them).
    // Greedy: the argmax of row i's shaped logits.
    Token argmax(size_t i);
    // Sampling: row i's warped distribution.
    Distribution warped(size_t i);
    // After acceptance (rows 0..n read, d_1..d_n accepted): the grammar takes the step's
    // correction or bonus token.
    void emit(Token token);

private:
    void advance_to(size_t i);
    // Row i's logits with penalties applied (the raw row when there are none).
    const float* penalized(size_t i);
    // Row `logits` masked to what the grammar allows over the whole vocabulary (in buffer_).
    const float* masked(const float* logits);
    Token constrained_argmax(const float* logits);
    Distribution constrained_warp(const float* logits);
    // Row i shaped as plain decoding shapes it, from its candidates' logits alone: the allowed
    // ones penalized, -infinity elsewhere (null when row i has no candidates).
    const float* from_candidates(size_t i);

    const Context& target_;
    int first_row_;
    const std::vector<Token>& drafts_;
    const SamplingParams& params_;
    Grammar* grammar_;
    const std::vector<std::vector<Token>>* candidates_;
    std::vector<Token> window_;  // the tokens before the current row (penalty window only)
    std::vector<float> buffer_;
    size_t row_ = 0;  // the row the grammar and the window are at
};

}  // namespace localspec
