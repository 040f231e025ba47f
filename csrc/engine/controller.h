// The draft-length controller (docs/design.md, "The controller"): learns, online, what a drafted
// token costs, what verifying j tokens costs and how often drafts are accepted at each draft
// position, and picks the k that maximises expected tokens per second, including k = 0 (plain
// decoding) when drafting does not pay.
//
// With conditional acceptance a_i at draft position i (the chance that d_i is accepted given
// that d_1 .. d_{i-1} were), a step that drafts k tokens emits on average
//     E(k) = 1 + sum_{j=1..k} prod_{i=1..j} a_i      tokens (accepted prefix + correction/bonus)
// and costs T(k) = s + k * c + V(k + 1) seconds (c: draft seconds per token, V(j): seconds for a
// target pass over j rows, priced by whether it keeps the last pass's shape: next_pass_seconds;
// s: what drafting must pay once before its first token, a draft model's catch-up over the
// tokens it has not seen, 0 for other kinds and for plain decoding).
// Plain decoding is E(0) / V(1) = 1 / V(1).
//
// The worst case is bounded by design. Drafting must earn its place:
//   * exploit: draft only where a PESSIMISTIC estimate of acceptance (a lower confidence bound,
//     further cut by a fast-moving estimate so that a kind that stops being right is dropped
//     within a few steps) still beats plain decoding, and what the draft risks (its worst
//     case times the pessimistic chance of it) fits the credit;
//   * explore: otherwise draft only when an optimistic estimate could win AND the exploration
//     budget pays for the draft's worst case (every token rejected) in full;
//   * evidence is also free: a deterministic proposal that was not verified is checked against
//     what the target produced after it (observe_acceptance);
//   * credit: each request starts with none, earns kBudget (2%) of a plain pass per emitted
//     token, gains or loses what each drafting step actually won or lost against plain
//     decoding, and is capped. Exploiting may go kExploitAllowance below zero; exploring may
//     spend only the budget (and what probes themselves won), never what exploiting won.
// So exploring costs a request at most kBudget of its plain time, and exploiting at most
// kExploitAllowance plain passes beyond what it won, in expectation under the pessimistic
// estimate (docs/design.md, "The controller").
//
// Timings are the weak evidence (another process on the CPU makes a pass look cheap or dear at
// random); acceptance is not. So:
//   * the gate: a kind whose long acceptance record (first drafted tokens, never weighed down
//     per request) says its first token is accepted less than kMinAcceptance of the time, even
//     optimistically, is off whatever the timings say: no exploiting, no exploring, only a
//     recheck of one token after 32, 64, 128 ... declined steps (back to 32 after a hit);
//   * probes are bounded in count per request (kProbeFloor + kProbeShare per step) as well as
//     in time;
//   * when the pass timings are noisy (timing_noise above kNoisyTimings, until it falls below
//     kQuietTimings: the mean relative deviation of pass samples from their estimate),
//     acceptance decides whether to draft
//     (the kind's pessimistic first-token acceptance at least kNoisyAcceptance) and the costs
//     only how much.
#pragma once

#include <vector>

#include "draft/draft_kind.h"

namespace localspec {

// What the controller has learned, kept across requests (and saved by `localspec run`).
struct ControllerMemory {
    // [slot][i]: decayed counts of drafts that reached position i (trials) and of those accepted
    // (hits); hits / trials estimates the conditional acceptance a_{i+1}.
    std::vector<std::vector<double>> trials, hits;
    std::vector<double> verify;      // [rows]: smoothed seconds of a target pass; 0 = not measured
    std::vector<double> draft_cost;  // [slot]: smoothed draft seconds per drafted token
    // [slot]: the long record of first drafted tokens (decayed per observation of the kind,
    // never weighed down per request): what the gate reads.
    std::vector<double> evidence_trials, evidence_hits;
    double timing_noise = 0;  // mean relative deviation of pass-cost samples from their estimate
};

// The first n tokens of a chained draft, of a kind of their own (grammar-forced text) learned in
// `slot`; the tokens after them are the draft's kind.
struct DraftLead {
    int n = 0;
    int slot = 0;
};

class DraftController {
public:
    explicit DraftController(int k_max);

    int k_max() const { return k_max_; }
    // Acceptance and draft cost are tracked per kind of draft, in the kind's slot
    // (DraftKind::slot: a draft model or head in slot 0; an n-gram lookup by its match length,
    // since a 4-token match predicts better than a 2-token one and costs nothing to draft).
    static constexpr int kSlots = DraftKind::kSlots;

    // What belongs to one request (its credit and recent acceptance), as opposed to what is
    // learned for all of them. Batched generation keeps one per sequence and swaps it in around
    // that sequence's calls (swap_request); one request at a time never needs to.
    struct RequestState {
        double credit = 0, explore_credit = 0;
        bool exploring = false;
        std::vector<double> fast = std::vector<double>(kSlots, 0.0);
        int steps = 0, probes = 0;  // choices made and probes among them (the probe count bound)
    };
    void swap_request(RequestState& other);

    // A new request: its credit starts at zero, and what was learned before is kept but weighed
    // down to a few observations' worth, so that the request's own evidence soon dominates.
    void begin_request();
    // Draft length for the next step, for a draft of this kind, at most `limit` (the drafter's
    // proposal length when it drafts first), where drafting first pays `setup_seconds` once
    // (Drafter::catch_up_seconds).
    int choose(int slot = 0, int limit = 1 << 30, double setup_seconds = 0);
    // What the step did: drafted k tokens (k may be below the choice when the drafter had
    // fewer to offer), accepted n of them, and how long drafting and verification took.
    // A lead's acceptance counts for its slot, from position 0, and the rest's for `slot`, from
    // position 0 too, when the whole lead was accepted; the draft seconds are shared per token,
    // less `setup_seconds` (the one-time part that choose() priced: it counts in the credit,
    // not in the cost per token).
    void observe(int k, int n_accepted, double draft_seconds, double verify_seconds, int slot = 0,
                 DraftLead lead = {}, double setup_seconds = 0);
    // Acceptance evidence without a pass: a proposal of k tokens that was not verified, of which
    // the first n turned out to be what the target produced (a deterministic draft, checked
    // against the tokens emitted after it). Updates acceptance only, not costs or credit.
    void observe_acceptance(int k, int n_accepted, int slot = 0);
    // Seeds V(rows) from a calibration pass (engine start-up), before any step has measured it.
    void seed_verify_seconds(int rows, double seconds);

    // Estimates. position is 0-based (0: the first drafted token); acceptance at position -1 is
    // the kind's pooled acceptance over all positions.
    double acceptance(int slot = 0, int position = -1) const;             // mean estimate
    double pessimistic_acceptance(int slot = 0, int position = 0) const;  // what exploiting uses
    double verify_seconds(int rows) const;                                // V(rows)
    // What the next pass over `rows` rows costs given the last pass's rows: a pass of the same
    // shape as the one before can cost less (llama.cpp reuses its graph; over RPC ggml then
    // sends no new graph to the workers). V(rows) until both kinds are measured.
    double next_pass_seconds(int rows) const;
    double draft_seconds_per_token(int slot = 0) const;
    enum class Estimate { Mean, Pessimistic, Optimistic };
    double expected_rate(int k, int slot = 0, Estimate estimate = Estimate::Mean) const;  // E(k) / T(k)
    double credit() const { return credit_; }  // seconds drafting may still lose in this request
    // The gate: whether the kind's acceptance record leaves it worth drafting at all.
    bool worth_probing(int slot = 0) const;
    double timing_noise() const { return mem_.timing_noise; }
    bool noisy() const;  // timings too noisy to decide from: acceptance decides
    int probes() const { return probes_; }  // probes in this request so far (the count bound)

    const ControllerMemory& memory() const { return mem_; }
    // Restores saved memory; entries of the wrong shape (another k_max or kind count) are ignored.
    void restore(const ControllerMemory& memory);

private:
    double bounded_acceptance(int slot, int position, double z) const;
    double worst_loss(int k, int slot) const;  // seconds lost if every drafted token is rejected
    double fast_ratio(int slot) const;
    int explore(int slot, int limit) const;
    bool may_probe() const;
    int choose_length(int slot, int limit);  // choose() once setup_ is set
    int choose_noisy(int slot, int limit);
    int recheck(int slot);
    void resolve_recheck(int slot, bool accepted);

    int k_max_;
    ControllerMemory mem_;
    // The current request's state (RequestState):
    std::vector<double> fast_;  // [slot]: recent share of drafted tokens accepted (fast_ratio)
    double credit_ = 0;          // what drafting may still lose in this request (seconds)
    double explore_credit_ = 0;  // the part of it that exploring may spend: its budget only
    bool exploring_ = false;     // the last choice was a probe (paid from explore_credit_)
    int steps_ = 0, probes_ = 0;  // choices and probes in this request (RequestState)
    // [slot]: declined steps left before a gated-off kind is rechecked, the current spacing,
    // and whether a recheck is waiting for its outcome (across requests: not per request).
    std::vector<int> recheck_after_, recheck_spacing_;
    std::vector<bool> recheck_pending_;
    // Pass seconds by rows, split by whether the pass had the previous pass's rows (learned in
    // this process only; 0 = not measured), and the rows of the last observed pass.
    std::vector<double> same_shape_, new_shape_;
    int last_rows_ = 0;
    std::vector<int> samples_;  // [rows]: passes observed in this process (timing_noise)
    bool noisy_ = false;  // timing_noise rose past kNoisyTimings and has not fallen to kQuietTimings
    double setup_ = 0;  // the one-time seconds of the choice being made (choose's setup_seconds)
};

}  // namespace localspec
