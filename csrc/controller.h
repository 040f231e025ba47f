// The draft-length controller (DESIGN.md §4): learns, online, what a drafted token costs,
// what verifying j tokens costs and how often drafts are accepted, and picks the k that
// maximises expected tokens per second, including k = 0 (plain decoding) when drafting loses.
//
// With per-token acceptance a, a step that drafts k tokens emits on average
//     E(k) = (1 - a^(k+1)) / (1 - a)      tokens (accepted prefix + correction/bonus)
// and costs T(k) = k * c + V(k + 1) seconds (c: draft seconds per token, V(j): seconds for a
// target pass over j rows). The controller maximises E(k) / T(k); plain decoding is E(0)/V(1).
#pragma once

#include <vector>

namespace localspec {

class DraftController {
public:
    explicit DraftController(int k_max);

    int k_max() const { return k_max_; }
    // Acceptance and draft cost are tracked per kind of draft (e.g. the n-gram match length: a
    // 4-token match predicts better than a 2-token one, and costs nothing to draft, unlike a
    // draft model, kind 0); kinds are 0 .. kKinds-1.
    static constexpr int kKinds = 8;

    // Draft length for the next step, for a draft of this kind, at most `limit` (the drafter's
    // proposal length when it drafts first).
    int choose(int kind = 0, int limit = 1 << 30);
    // What the step did: drafted k tokens (k may be below the choice when the drafter had
    // fewer to offer), accepted n of them, and how long drafting and verification took.
    void observe(int k, int n_accepted, double draft_seconds, double verify_seconds, int kind = 0);
    // A new generation: acceptance is prompt-specific, costs are not.
    void reset_acceptance();

    double acceptance(int kind = 0) const;  // current estimate of a
    double verify_seconds(int rows) const;  // estimate of V(rows)
    double draft_seconds_per_token(int kind = 0) const;
    double expected_rate(int k, int kind = 0) const;  // E(k) / T(k), tokens per second

private:
    bool could_win(int kind) const;  // would drafting beat plain decoding at acceptance 1?

    int k_max_;
    // Decayed counts per kind: a = accepted / (accepted + rejections).
    std::vector<double> accepted_, rejections_;
    std::vector<double> verify_;            // [j]: EMA of V(j); 0 = not measured
    std::vector<double> draft_cost_;        // [kind]: EMA of draft seconds per drafted token
    int plain_steps_ = 0;                   // k = 0 choices since the last probe or draft
    int probe_every_ = 0;                   // plain steps before the next probe (backs off)
    bool probing_ = false;                  // the last choice was a probe
    int steps_ = 0;
};

}  // namespace localspec
