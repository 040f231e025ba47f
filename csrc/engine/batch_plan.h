// Pure decisions of batched generation (docs/design.md, "Batched generation"): what a target pass
// costs by its total rows, how many rows each sequence's draft gets in a shared pass, and how
// much of the new sequences' prompts to prefill before the next pass.
#pragma once

#include <vector>

namespace localspec {

// Seconds of one target pass by its total row count, from measured points (start-up
// calibration, then every batched pass): piecewise linear between points, extended with the
// slope of the last two beyond the last. Each point is the smoothed cost of its exact row count.
class PassCostCurve {
public:
    bool empty() const { return rows_.empty(); }
    // A measurement of a pass over `rows` rows (start-up, or online: smoothed into that point).
    void observe(int rows, double seconds);
    double seconds(int rows) const;
    int max_measured() const { return rows_.empty() ? 0 : rows_.back(); }
    // The smallest measured row count above `rows`, or 0 when there is none.
    int next_measured(int rows) const;

private:
    std::vector<int> rows_;  // increasing
    std::vector<double> seconds_;
};

// The draft rows each sequence gets in one pass shared by several. gains[i][j] is the chance
// that sequence i's draft token j + 1 is accepted together with all before it (non-increasing
// in j; its length is what that sequence's own controller proposed). The pass holds base_rows
// rows anyway (each sequence's [last], and drafts that are not to be cut), which emit
// base_tokens on average; m more draft rows add the m largest gains and cost cost(base_rows + m).
// The m that maximises tokens per second wins (0 when the batch alone fills the hardware), and
// each sequence keeps as many of its tokens as are among the m largest. Returns the new draft
// length of each sequence.
//
// With `probe`, a larger m than the winner's, if the gains allow one: the one that reaches the
// next measured row count above the winner's (or all gains, if it lies beyond them). The curve
// learns online only the row counts that run, so a count whose cost start-up calibration
// overestimated would otherwise never run again and never be corrected. The engine probes on
// one batched pass in kProbeEvery: when the curve is right that costs at most that share of
// the difference between the two rates.
std::vector<int> batch_draft_lengths(const std::vector<std::vector<double>>& gains, const PassCostCurve& cost,
                                     int base_rows, double base_tokens, bool probe = false);
constexpr int kProbeEvery = 32;

// Prompt tokens to prefill for each joining sequence (remaining[i] left, in arrival order)
// before the next pass: the oldest unfinished prompt only, all of it when nobody generates, else
// at most `chunk` tokens so that running streams keep flowing between pieces. One prompt per
// pass: on a CPU prefill costs its tokens whatever the batch, so prompts read one at a time give
// each new stream its first token after its own prompt and those before it, not after all.
std::vector<int> plan_prefill(const std::vector<int>& remaining, bool others_running, int chunk);

}  // namespace localspec
