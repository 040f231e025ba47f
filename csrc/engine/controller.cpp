#include "engine/controller.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace localspec {

namespace {

constexpr double kDecay = 0.97;         // slow acceptance memory: ~33 steps of a kind
constexpr double kAge = 0.99;           // a declined proposal ages its kind's evidence a little
constexpr double kMemoryTrials = 4.0;   // what a new request inherits: at most this many steps
constexpr double kShrink = 2.0;         // pseudo-steps pulling a position towards the kind's mean
constexpr double kZ = 0.5;              // confidence bounds: mean -/+ kZ standard deviations
constexpr double kFastWeight = 0.5;     // the fast estimate: half its value is the last step
constexpr double kFastFloor = 0.5;      // ... and it cuts acceptance once below this share of the mean
constexpr double kBudget = 0.02;        // credit earned per emitted token, in plain passes
constexpr double kExploitAllowance = 0.5;  // plain passes exploiting may lose beyond the credit
constexpr double kCreditCap = 4.0;      // plain passes of credit a request may bank
constexpr double kShapeRun = 4;  // passes a new pass shape is expected to be kept for
constexpr double kCostSmoothing = 0.2;  // EMA weight of a new cost sample
// The gate (acceptance alone decides whether a kind is worth drafting at all).
constexpr double kEvidenceDecay = 0.98;  // the long record: ~50 first tokens of a kind
constexpr double kMinAcceptance = 0.1;   // below this (optimistic bound) a kind is off
constexpr double kGateZ = 1.0;           // ... the bound: mean + 1 standard deviation
constexpr int kRecheckFirst = 32;        // declined steps before the first recheck of an off kind
constexpr int kRecheckMax = 4096;        // the spacing doubles after each miss, up to this
// Probes per request: at most kProbeFloor plus kProbeShare per choice, whatever they cost.
constexpr double kProbeFloor = 4.0;
constexpr double kProbeShare = 1.0 / 16;
// Noisy timings: the deviation measure's EMA weight, the level above which timings are noisy,
// and the pessimistic first-token acceptance a kind then needs to be drafted.
constexpr double kNoiseWeight = 0.1;
constexpr int kNoiseAfter = 8;  // samples of a row count before its deviations count
constexpr double kNoisyTimings = 0.25;
constexpr double kQuietTimings = 0.15;  // ... and the level below which they are clean again
constexpr double kNoisyAcceptance = 0.5;

// A cost sample moves the estimate by kCostSmoothing of its difference, and counts at most
// kSpikeClip times the estimate: a pass that another process preempted (time only ever gets
// added) must not make the plain pass look dear and drafting cheap, or the reverse.
constexpr double kSpikeClip = 2.0;
double ema(double old, double sample) {
    return old == 0 ? sample : old + kCostSmoothing * (std::min(sample, kSpikeClip * old) - old);
}

size_t slot_index(int slot) { return static_cast<size_t>(std::clamp(slot, 0, DraftController::kSlots - 1)); }

double sum(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s;
}

// The prior of a kind's acceptance, in pseudo-steps: one accepted and one rejected, except for
// grammar-forced text. The grammar allows that text alone, so the target can only differ in how
// it splits it into tokens: nine accepted of ten, which a request's own misses soon outweigh.
struct Prior {
    double hits, trials;
};
Prior prior(size_t slot) {
    return slot == static_cast<size_t>(DraftKind::kForcedSlot) ? Prior{9.0, 10.0} : Prior{1.0, 2.0};
}

// The kind's acceptance over all positions, with its prior.
double pooled_acceptance(const ControllerMemory& m, size_t slot) {
    return (sum(m.hits[slot]) + prior(slot).hits) / (sum(m.trials[slot]) + prior(slot).trials);
}

}  // namespace

DraftController::DraftController(int k_max) : k_max_(std::max(0, k_max)) {
    const size_t positions = static_cast<size_t>(k_max_);
    mem_.trials.assign(kSlots, std::vector<double>(positions, 0.0));
    mem_.hits.assign(kSlots, std::vector<double>(positions, 0.0));
    mem_.verify.assign(positions + 2, 0.0);
    mem_.draft_cost.assign(kSlots, 0.0);
    mem_.evidence_trials.assign(kSlots, 0.0);
    mem_.evidence_hits.assign(kSlots, 0.0);
    recheck_after_.assign(kSlots, kRecheckFirst);
    recheck_spacing_.assign(kSlots, kRecheckFirst);
    recheck_pending_.assign(kSlots, false);
    same_shape_.assign(positions + 2, 0.0);
    new_shape_.assign(positions + 2, 0.0);
    samples_.assign(positions + 2, 0);
    begin_request();
}

void DraftController::begin_request() {
    credit_ = explore_credit_ = 0;
    exploring_ = false;
    steps_ = probes_ = 0;
    fast_.assign(kSlots, 0.0);
    for (size_t slot = 0; slot < kSlots; ++slot) {
        auto& trials = mem_.trials[slot];
        auto& hits = mem_.hits[slot];
        const double first = trials.empty() ? 0.0 : trials[0];
        if (first > kMemoryTrials) {
            const double scale = kMemoryTrials / first;
            for (double& x : trials) x *= scale;
            for (double& x : hits) x *= scale;
        }
        fast_[slot] = acceptance(static_cast<int>(slot), 0);
    }
}

void DraftController::swap_request(RequestState& other) {
    std::swap(credit_, other.credit);
    std::swap(explore_credit_, other.explore_credit);
    std::swap(exploring_, other.exploring);
    std::swap(fast_, other.fast);
    std::swap(steps_, other.steps);
    std::swap(probes_, other.probes);
}

void DraftController::restore(const ControllerMemory& memory) {
    auto fits = [this](const std::vector<std::vector<double>>& table) {
        if (table.size() != static_cast<size_t>(kSlots)) return false;
        for (const auto& row : table) {
            if (row.size() != static_cast<size_t>(k_max_)) return false;
        }
        return true;
    };
    if (fits(memory.trials) && fits(memory.hits)) {
        mem_.trials = memory.trials;
        mem_.hits = memory.hits;
    }
    if (memory.verify.size() == mem_.verify.size()) mem_.verify = memory.verify;
    if (memory.draft_cost.size() == mem_.draft_cost.size()) mem_.draft_cost = memory.draft_cost;
    if (memory.evidence_trials.size() == mem_.evidence_trials.size() &&
        memory.evidence_hits.size() == mem_.evidence_hits.size()) {
        mem_.evidence_trials = memory.evidence_trials;
        mem_.evidence_hits = memory.evidence_hits;
    }
    mem_.timing_noise = std::max(0.0, memory.timing_noise);
    noisy_ = mem_.timing_noise > kNoisyTimings;
    begin_request();
}

void DraftController::seed_verify_seconds(int rows, double seconds) {
    if (rows >= 1 && rows < static_cast<int>(mem_.verify.size()) && mem_.verify[static_cast<size_t>(rows)] == 0) {
        mem_.verify[static_cast<size_t>(rows)] = seconds;
    }
}

double DraftController::acceptance(int slot, int position) const {
    const size_t k = slot_index(slot);
    const double mean = pooled_acceptance(mem_, k);
    if (position < 0 || position >= k_max_) return mean;
    const size_t i = static_cast<size_t>(position);
    return (mem_.hits[k][i] + kShrink * mean) / (mem_.trials[k][i] + kShrink);
}

// The position's mean moved z standard deviations of the kind's pooled estimate (a proportion
// over all its trials): the evidence is mostly in how often the kind is right at all; the
// per-position means only shape it.
double DraftController::bounded_acceptance(int slot, int position, double z) const {
    const size_t k = slot_index(slot);
    const double pooled = pooled_acceptance(mem_, k);
    const double n = sum(mem_.trials[k]) + prior(k).trials;
    const double a = acceptance(slot, position);
    return std::clamp(a + z * std::sqrt(pooled * (1.0 - pooled) / n), 0.0, 1.0);
}

// The fast estimate (how often recent steps of the kind accepted their first drafted token,
// halving the past at every step) relative to a quarter of the slow estimate of that chance, at
// most 1: ordinary luck leaves it at 1, while a kind that stops being right is cut to about half
// after three steps that accepted nothing and to a quarter after four, however long its record.
double DraftController::fast_ratio(int slot) const {
    const size_t k = slot_index(slot);
    return std::min(1.0, fast_[k] / (kFastFloor * acceptance(slot, 0)));
}

double DraftController::pessimistic_acceptance(int slot, int position) const {
    return bounded_acceptance(slot, position, -kZ) * fast_ratio(slot);
}

double DraftController::draft_seconds_per_token(int slot) const { return mem_.draft_cost[slot_index(slot)]; }

double DraftController::verify_seconds(int rows) const {
    // The measured value if any. An unmeasured size is assumed to cost what the nearest
    // smaller measured size costs (optimism: extra rows free until measured), so that the
    // controller tries it once and learns; batch costs are too irregular to extrapolate
    // (on CPUs 8 rows can cost less than 5). The engine seeds every size at start-up.
    const auto& v = mem_.verify;
    const int n = static_cast<int>(v.size()) - 1;
    rows = std::clamp(rows, 1, n);
    for (int r = rows; r >= 1; --r) {
        if (v[static_cast<size_t>(r)] > 0) return v[static_cast<size_t>(r)];
    }
    for (int r = rows + 1; r <= n; ++r) {
        if (v[static_cast<size_t>(r)] > 0) return v[static_cast<size_t>(r)];
    }
    return 1.0;  // nothing measured yet
}

double DraftController::next_pass_seconds(int rows) const {
    const size_t r = static_cast<size_t>(rows);
    if (r >= same_shape_.size() || same_shape_[r] == 0 || new_shape_[r] == 0) return verify_seconds(rows);
    if (rows == last_rows_) return same_shape_[r];
    // A new shape is paid once and kept for a few passes: charging all of it to this step
    // would keep the controller on its first shape for good.
    return same_shape_[r] + std::max(0.0, new_shape_[r] - same_shape_[r]) / kShapeRun;
}

double DraftController::expected_rate(int k, int slot, Estimate estimate) const {
    double tokens = 1.0, reach = 1.0;  // reach: chance that every draft so far was accepted
    for (int i = 0; i < k; ++i) {
        const double a = estimate == Estimate::Mean          ? acceptance(slot, i)
                         : estimate == Estimate::Pessimistic ? pessimistic_acceptance(slot, i)
                                                             : bounded_acceptance(slot, i, kZ);
        reach *= a;
        tokens += reach;
    }
    const double seconds = (k > 0 ? setup_ : 0.0) + k * draft_seconds_per_token(slot) + next_pass_seconds(k + 1);
    return seconds > 0 ? tokens / seconds : 0.0;
}

// A step whose drafts are all rejected emits one token (the correction) and costs the drafts
// and a (k + 1)-row pass; plain decoding would have emitted that token for one row. A pass size
// not measured yet is priced as k + 1 separate passes (it never costs more in practice).
double DraftController::worst_loss(int k, int slot) const {
    const size_t rows = static_cast<size_t>(k) + 1;
    const bool measured = rows < mem_.verify.size() && mem_.verify[rows] > 0;
    const double pass = measured ? mem_.verify[rows] : (k + 1) * verify_seconds(1);
    return setup_ + k * draft_seconds_per_token(slot) + pass - verify_seconds(1);
}

bool DraftController::worth_probing(int slot) const {
    const size_t i = slot_index(slot);
    const double n = mem_.evidence_trials[i] + 2.0;
    const double p = (mem_.evidence_hits[i] + 1.0) / n;
    return p + kGateZ * std::sqrt(p * (1.0 - p) / n) >= kMinAcceptance;
}

bool DraftController::noisy() const { return noisy_; }

bool DraftController::may_probe() const { return probes_ < kProbeFloor + kProbeShare * steps_; }

// A kind the gate turned off drafts one token after recheck_spacing_ declined steps (counted
// per kind), if the probe bounds allow it; until then nothing.
int DraftController::recheck(int slot) {
    const size_t i = slot_index(slot);
    if (recheck_after_[i] > 0) --recheck_after_[i];
    if (recheck_after_[i] > 0 || !may_probe() || worst_loss(1, slot) > std::min(credit_, explore_credit_)) return 0;
    recheck_pending_[i] = true;
    recheck_after_[i] = recheck_spacing_[i];  // a recheck the drafter could not draft waits too
    exploring_ = true;
    ++probes_;
    return 1;
}

// A recheck's outcome: a hit brings the next one back to the first spacing (three hits in a
// row reopen a kind the record had closed), a miss doubles the wait.
void DraftController::resolve_recheck(int slot, bool accepted) {
    const size_t i = slot_index(slot);
    if (!recheck_pending_[i]) return;
    recheck_pending_[i] = false;
    recheck_spacing_[i] = accepted ? kRecheckFirst : std::min(2 * recheck_spacing_[i], kRecheckMax);
    recheck_after_[i] = recheck_spacing_[i];
}

// Noisy timings: the kind is drafted when its pessimistic first-token acceptance reaches
// kNoisyAcceptance, at the length the mean estimates and the costs favour (costs only shape how
// much); probed only when its optimistic acceptance could reach it, within the count bound.
int DraftController::choose_noisy(int slot, int limit) {
    auto best_length = [&](Estimate estimate) {
        int best = 1;
        double best_rate = expected_rate(1, slot, estimate);
        for (int k = 2; k <= limit; ++k) {
            const double rate = expected_rate(k, slot, estimate);
            if (rate > best_rate) {
                best = k;
                best_rate = rate;
            }
        }
        return best;
    };
    if (pessimistic_acceptance(slot, 0) >= kNoisyAcceptance) {
        // A one-time setup (a draft model's catch-up) is a known cost, not timing noise: a
        // draft that cannot win it back even at the mean acceptance waits.
        const int k = best_length(Estimate::Mean);
        return setup_ > 0 && expected_rate(k, slot) <= expected_rate(0, slot) ? 0 : k;
    }
    // The probe's price in time is not checked: the credit is made of the same noisy timings
    // (a few preempted passes sink it for dozens of steps). Its count bounds it, and only a
    // kind that could reach kNoisyAcceptance is probed.
    if (bounded_acceptance(slot, 0, kZ) < kNoisyAcceptance || !may_probe()) return 0;
    const int k = best_length(Estimate::Optimistic);
    exploring_ = true;
    ++probes_;
    return k;
}

int DraftController::choose(int slot, int limit, double setup_seconds) {
    setup_ = std::max(0.0, setup_seconds);
    const int k = choose_length(slot, limit);
    setup_ = 0;
    return k;
}

int DraftController::choose_length(int slot, int limit) {
    exploring_ = false;
    limit = std::clamp(limit, 0, k_max_);
    if (limit == 0) return 0;
    if (mem_.verify[1] == 0) return 0;  // measure a plain pass first: the baseline everything is compared to
    ++steps_;
    if (!worth_probing(slot)) return recheck(slot);
    if (noisy()) return choose_noisy(slot, limit);
    // Exploit: among the k whose pessimistic rate beats plain decoding and whose risk the request
    // can afford, the one with the best expected (mean) rate. Every k is judged with its own V(k + 1): on CPUs batch costs are
    // far from linear (4 or 8 rows can cost less than 3 or 7).
    const double plain = expected_rate(0, slot);
    int best = 0;
    double best_rate = plain;
    // The worst case (all rejected) has at most the pessimistic chance 1 - a_1 of happening.
    const double miss = 1.0 - pessimistic_acceptance(slot, 0);
    for (int k = 1; k <= limit; ++k) {
        if (miss * worst_loss(k, slot) > std::max(credit_, 0.0) + kExploitAllowance * verify_seconds(1)) continue;
        if (expected_rate(k, slot, Estimate::Pessimistic) <= plain) continue;
        const double rate = expected_rate(k, slot);
        if (rate > best_rate) {
            best = k;
            best_rate = rate;
        }
    }
    if (best > 0) return best;
    const int probe = may_probe() ? explore(slot, limit) : 0;
    if (probe > 0) {
        exploring_ = true;
        ++probes_;
        return probe;
    }
    // Declined: the evidence against this kind ages a little, so that the optimistic estimate
    // eventually asks for another (paid-for) probe and a change of text is noticed.
    const size_t i = slot_index(slot);
    for (double& x : mem_.trials[i]) x *= kAge;
    for (double& x : mem_.hits[i]) x *= kAge;
    return 0;
}

// A draft that the optimistic estimate says could win, paid in full from the exploration
// budget (never from what exploiting has won: that belongs to the user).
int DraftController::explore(int slot, int limit) const {
    const double plain = expected_rate(0, slot);
    int best = 0;
    double best_rate = plain;
    for (int k = 1; k <= limit; ++k) {
        if (worst_loss(k, slot) > std::min(credit_, explore_credit_)) continue;
        const double rate = expected_rate(k, slot, Estimate::Optimistic);
        if (rate > best_rate) {
            best = k;
            best_rate = rate;
        }
    }
    return best;
}

void DraftController::observe(int k, int n_accepted, double draft_seconds, double verify_seconds_, int slot,
                              DraftLead lead, double setup_seconds) {
    const size_t rows = static_cast<size_t>(k) + 1;
    if (rows < mem_.verify.size()) {
        // How far the sample is from what was expected, once this row count's estimate has
        // followed a few of this process's own passes (a calibrated or restored value can sit
        // a steady few percent off the passes of a real request).
        const double estimate = mem_.verify[rows];
        if (++samples_[rows] > kNoiseAfter && estimate > 0 && verify_seconds_ > 0) {
            const double deviation = std::min(std::abs(verify_seconds_ - estimate) / estimate, 2.0);
            mem_.timing_noise += kNoiseWeight * (deviation - mem_.timing_noise);
            // Hysteresis: a measure hovering at the threshold must not flip the decision rule
            // from step to step.
            if (mem_.timing_noise > kNoisyTimings) noisy_ = true;
            if (mem_.timing_noise < kQuietTimings) noisy_ = false;
        }
        mem_.verify[rows] = ema(mem_.verify[rows], verify_seconds_);
        auto& shaped = static_cast<int>(rows) == last_rows_ ? same_shape_ : new_shape_;
        shaped[rows] = ema(shaped[rows], verify_seconds_);
    }
    last_rows_ = static_cast<int>(rows);
    const double plain = verify_seconds(1);
    const double budget = kBudget * (n_accepted + 1) * plain;  // earned by every emitted token
    explore_credit_ = std::min(explore_credit_ + budget, kCreditCap * plain);
    if (k <= 0) {
        credit_ = std::min(credit_ + budget, kCreditCap * plain);
        return;
    }
    const double per_token = std::max(0.0, draft_seconds - setup_seconds) / k;
    const int n_lead = std::min(lead.n, k);
    if (n_lead > 0) {
        observe_acceptance(n_lead, std::min(n_accepted, n_lead), lead.slot);
        resolve_recheck(lead.slot, n_accepted > 0);
        const size_t j = slot_index(lead.slot);
        mem_.draft_cost[j] = ema(mem_.draft_cost[j], per_token);
    }
    if (k > n_lead && n_accepted >= n_lead) {
        observe_acceptance(k - n_lead, n_accepted - n_lead, slot);
        resolve_recheck(slot, n_accepted > n_lead);
        const size_t i = slot_index(slot);
        mem_.draft_cost[i] = ema(mem_.draft_cost[i], per_token);
    }
    // What this step won or lost against plain decoding of the same tokens.
    const double won = (n_accepted + 1) * plain - (draft_seconds + verify_seconds_);
    credit_ = std::min(credit_ + won + budget, kCreditCap * plain);
    if (exploring_) explore_credit_ = std::min(explore_credit_ + won, kCreditCap * plain);
}

void DraftController::observe_acceptance(int k, int n_accepted, int slot) {
    if (k <= 0) return;
    const size_t i = slot_index(slot);
    auto& trials = mem_.trials[i];
    auto& hits = mem_.hits[i];
    for (double& x : trials) x *= kDecay;
    for (double& x : hits) x *= kDecay;
    // Positions 0 .. n were reached (n < k: position n is the rejected one); 0 .. n-1 accepted.
    const int reached = std::min(n_accepted + 1, std::min(k, k_max_));
    for (int p = 0; p < reached; ++p) {
        trials[static_cast<size_t>(p)] += 1;
        if (p < n_accepted) hits[static_cast<size_t>(p)] += 1;
    }
    fast_[i] += kFastWeight * ((n_accepted > 0 ? 1.0 : 0.0) - fast_[i]);
    mem_.evidence_trials[i] = kEvidenceDecay * mem_.evidence_trials[i] + 1.0;
    mem_.evidence_hits[i] = kEvidenceDecay * mem_.evidence_hits[i] + (n_accepted > 0 ? 1.0 : 0.0);
}

}  // namespace localspec
