#include "controller.h"

#include <algorithm>
#include <cmath>

namespace localspec {

namespace {

constexpr double kDecay = 0.95;        // acceptance memory: ~20 steps
constexpr double kCostSmoothing = 0.2; // EMA weight of a new cost sample
constexpr double kPriorAccepted = 1.0, kPriorRejections = 1.0;  // a starts at 0.5
constexpr int kProbeEvery = 16;        // while plain, try drafting every this many steps
constexpr int kProbeLength = 2;
constexpr int kExploreEvery = 8;       // try one row beyond the best when that size is unmeasured
constexpr double kPriorRowCost = 0.5;
constexpr double kRequiredGain = 1.05;  // an unmeasured extra row costs half a single pass

double ema(double old, double sample) { return old == 0 ? sample : old + kCostSmoothing * (sample - old); }

}  // namespace

DraftController::DraftController(int k_max)
    : k_max_(std::max(0, k_max)), verify_(static_cast<size_t>(k_max_) + 2, 0.0) {
    reset_acceptance();
}

void DraftController::reset_acceptance() {
    accepted_.assign(kKinds, kPriorAccepted);
    rejections_.assign(kKinds, kPriorRejections);
    plain_steps_ = 0;
}

namespace {
size_t kind_index(int kind) { return static_cast<size_t>(std::clamp(kind, 0, DraftController::kKinds - 1)); }
}  // namespace

double DraftController::acceptance(int kind) const {
    const size_t i = kind_index(kind);
    return accepted_[i] / (accepted_[i] + rejections_[i]);
}

double DraftController::verify_seconds(int rows) const {
    // Measured value if any; otherwise interpolate between measured neighbours, or extrapolate
    // linearly from the two nearest (a pessimistic guess until measured).
    const int n = static_cast<int>(verify_.size()) - 1;
    rows = std::clamp(rows, 1, n);
    if (verify_[static_cast<size_t>(rows)] > 0) return verify_[static_cast<size_t>(rows)];
    int lo = rows - 1, hi = rows + 1;
    while (lo >= 1 && verify_[static_cast<size_t>(lo)] == 0) --lo;
    while (hi <= n && verify_[static_cast<size_t>(hi)] == 0) ++hi;
    if (lo >= 1 && hi <= n) {
        const double t = static_cast<double>(rows - lo) / (hi - lo);
        return verify_[static_cast<size_t>(lo)] * (1 - t) + verify_[static_cast<size_t>(hi)] * t;
    }
    if (lo >= 1) {  // extrapolate upwards along the measured slope (a prior one if unknown)
        int lo2 = lo - 1;
        while (lo2 >= 1 && verify_[static_cast<size_t>(lo2)] == 0) --lo2;
        const double v_lo = verify_[static_cast<size_t>(lo)];
        const double slope = lo2 >= 1 ? std::max(0.0, (v_lo - verify_[static_cast<size_t>(lo2)]) / (lo - lo2))
                                      : kPriorRowCost * v_lo / lo;
        return v_lo + slope * (rows - lo);
    }
    if (hi <= n) return verify_[static_cast<size_t>(hi)] * rows / hi;
    return static_cast<double>(rows);  // nothing measured yet: unit cost per row
}

double DraftController::expected_rate(int k, int kind) const {
    const double a = std::min(acceptance(kind), 0.999);
    const double tokens = (1.0 - std::pow(a, k + 1)) / (1.0 - a);
    const double seconds = k * draft_cost_ + verify_seconds(k + 1);
    return seconds > 0 ? tokens / seconds : 0.0;
}

int DraftController::choose(int kind) {
    if (k_max_ == 0) return 0;
    if (verify_[1] == 0) return 0;  // measure a plain pass first: the baseline everything is compared to
    // Drafting must promise a clear gain over plain decoding: estimates are noisy, and a
    // wrong "draft" costs more than a wrong "don't".
    int best = 0;
    double best_rate = expected_rate(0, kind) * kRequiredGain;
    for (int k = 1; k <= k_max_; ++k) {
        const double rate = expected_rate(k, kind);
        if (rate > best_rate) {
            best = k;
            best_rate = rate;
        }
    }
    ++steps_;
    // While plain decoding wins, probe now and then in case acceptance has improved; but not
    // when even perfect acceptance could not pay for the drafts (an expensive draft model).
    if (best == 0 && ++plain_steps_ % kProbeEvery == 0 && could_win(kind)) return std::min(kProbeLength, k_max_);
    if (best > 0) plain_steps_ = 0;
    // Costs of longer batches are extrapolated until measured: look one step further now and
    // then, so a flat cost curve (a GPU) is discovered rather than assumed away.
    if (best > 0 && best < k_max_ && verify_[static_cast<size_t>(best) + 2] == 0 && steps_ % kExploreEvery == 0) {
        return best + 1;
    }
    return best;
}

bool DraftController::could_win(int kind) const {
    const double plain = expected_rate(0, kind) * kRequiredGain;
    for (int k = 1; k <= k_max_; ++k) {
        const double perfect = (k + 1) / (k * draft_cost_ + verify_seconds(k + 1));
        if (perfect > plain) return true;
    }
    return false;
}

void DraftController::observe(int k, int n_accepted, double draft_seconds, double verify_seconds, int kind) {
    if (k > 0) {
        const size_t i = kind_index(kind);
        accepted_[i] = accepted_[i] * kDecay + n_accepted;
        rejections_[i] = rejections_[i] * kDecay + (n_accepted < k ? 1 : 0);
        draft_cost_ = ema(draft_cost_, draft_seconds / k);
    }
    const size_t rows = static_cast<size_t>(k) + 1;
    if (rows < verify_.size()) verify_[rows] = ema(verify_[rows], verify_seconds);
}

}  // namespace localspec
