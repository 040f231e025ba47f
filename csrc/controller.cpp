#include "controller.h"

#include <algorithm>
#include <cmath>

namespace localspec {

namespace {

constexpr double kDecay = 0.95;        // acceptance memory: ~20 steps
constexpr double kCostSmoothing = 0.2; // EMA weight of a new cost sample
constexpr double kPriorAccepted = 1.0, kPriorRejections = 1.0;  // a starts at 0.5
constexpr int kProbeEvery = 8;         // while plain, try drafting after this many steps,
constexpr int kProbeEveryMax = 64;     // doubling after each probe that plain decoding still beats
constexpr int kProbeLength = 2;
constexpr int kExploreEvery = 8;       // while drafting, try an unmeasured batch size this often
constexpr double kRequiredGain = 1.0;   // drafting must beat plain decoding (no margin: costs are measured)

double ema(double old, double sample) { return old == 0 ? sample : old + kCostSmoothing * (sample - old); }

}  // namespace

DraftController::DraftController(int k_max)
    : k_max_(std::max(0, k_max)), verify_(static_cast<size_t>(k_max_) + 2, 0.0), draft_cost_(kKinds, 0.0) {
    reset_acceptance();
}

void DraftController::reset_acceptance() {
    accepted_.assign(kKinds, kPriorAccepted);
    rejections_.assign(kKinds, kPriorRejections);
    plain_steps_ = 0;
    probe_every_ = kProbeEvery;
}

namespace {
size_t kind_index(int kind) { return static_cast<size_t>(std::clamp(kind, 0, DraftController::kKinds - 1)); }
}  // namespace

double DraftController::acceptance(int kind) const {
    const size_t i = kind_index(kind);
    return accepted_[i] / (accepted_[i] + rejections_[i]);
}

double DraftController::draft_seconds_per_token(int kind) const { return draft_cost_[kind_index(kind)]; }

double DraftController::verify_seconds(int rows) const {
    // The measured value if any. An unmeasured size is assumed to cost what the nearest
    // smaller measured size costs (optimism: extra rows free until measured), so that the
    // controller tries it once and learns; batch costs are too irregular to extrapolate
    // (on CPUs 8 rows can cost less than 5).
    const int n = static_cast<int>(verify_.size()) - 1;
    rows = std::clamp(rows, 1, n);
    for (int r = rows; r >= 1; --r) {
        if (verify_[static_cast<size_t>(r)] > 0) return verify_[static_cast<size_t>(r)];
    }
    for (int r = rows + 1; r <= n; ++r) {
        if (verify_[static_cast<size_t>(r)] > 0) return verify_[static_cast<size_t>(r)];
    }
    return 1.0;  // nothing measured yet
}

double DraftController::expected_rate(int k, int kind) const {
    const double a = std::min(acceptance(kind), 0.999);
    const double tokens = (1.0 - std::pow(a, k + 1)) / (1.0 - a);
    const double seconds = k * draft_seconds_per_token(kind) + verify_seconds(k + 1);
    return seconds > 0 ? tokens / seconds : 0.0;
}

int DraftController::choose(int kind, int limit) {
    limit = std::clamp(limit, 0, k_max_);
    if (limit == 0) return 0;
    if (verify_[1] == 0) return 0;  // measure a plain pass first: the baseline everything is compared to
    // Drafting must promise a clear gain over plain decoding: estimates are noisy, and a
    // wrong "draft" costs more than a wrong "don't". Every k is judged with its own V(k + 1):
    // on CPUs batch costs are far from linear (4 or 8 rows can cost less than 3 or 7), and the
    // measured curve, not a formula, decides.
    int best = 0;
    double best_rate = expected_rate(0, kind) * kRequiredGain;
    for (int k = 1; k <= limit; ++k) {
        const double rate = expected_rate(k, kind);
        if (rate > best_rate) {
            best = k;
            best_rate = rate;
        }
    }
    ++steps_;
    // While plain decoding wins, probe now and then in case acceptance has improved; but not
    // when even perfect acceptance could not pay for the drafts (an expensive draft model),
    // and less and less often while probes keep losing (a draft model near break-even pays
    // for every probe). A probe, or every kExploreEvery steps while drafting, tries the
    // smallest unmeasured batch size, so that the whole cost curve gets measured.
    const bool probe = best == 0 && ++plain_steps_ >= probe_every_ && could_win(kind);
    probing_ = probe;
    if (probe) {
        plain_steps_ = 0;
        probe_every_ = std::min(2 * probe_every_, kProbeEveryMax);
    }
    if (best > 0) {
        plain_steps_ = 0;
        probe_every_ = kProbeEvery;
    }
    if (probe || (best > 0 && steps_ % kExploreEvery == 0)) {
        for (int k = 1; k <= limit; ++k) {
            if (verify_[static_cast<size_t>(k) + 1] == 0) return k;
        }
    }
    return probe ? std::min(kProbeLength, limit) : best;
}

bool DraftController::could_win(int kind) const {
    const double plain = expected_rate(0, kind) * kRequiredGain;
    for (int k = 1; k <= k_max_; ++k) {
        const double perfect = (k + 1) / (k * draft_seconds_per_token(kind) + verify_seconds(k + 1));
        if (perfect > plain) return true;
    }
    return false;
}

void DraftController::observe(int k, int n_accepted, double draft_seconds, double verify_seconds, int kind) {
    if (k > 0) {
        const size_t i = kind_index(kind);
        if (probing_ && n_accepted == k) {
            // A probe accepted in full: the old estimate may be stale (the text turned to
            // something the drafter knows). Start again from the prior, so that a few more
            // steps decide, rather than waiting many backed-off probes to outweigh it.
            accepted_[i] = kPriorAccepted;
            rejections_[i] = kPriorRejections;
        }
        accepted_[i] = accepted_[i] * kDecay + n_accepted;
        rejections_[i] = rejections_[i] * kDecay + (n_accepted < k ? 1 : 0);
        draft_cost_[i] = ema(draft_cost_[i], draft_seconds / k);
    }
    const size_t rows = static_cast<size_t>(k) + 1;
    if (rows < verify_.size()) verify_[rows] = ema(verify_[rows], verify_seconds);
}

}  // namespace localspec
