#include "engine/batch_plan.h"

#include <algorithm>
#include <utility>

namespace localspec {

namespace {

constexpr double kCostSmoothing = 0.2;  // EMA weight of a new pass measurement
constexpr double kSpikeClip = 2.0;      // a preempted pass counts as at most twice the estimate

}  // namespace

void PassCostCurve::observe(int rows, double seconds) {
    if (rows < 1 || seconds <= 0) return;
    const auto it = std::lower_bound(rows_.begin(), rows_.end(), rows);
    const size_t i = static_cast<size_t>(it - rows_.begin());
    if (it != rows_.end() && *it == rows) {
        seconds_[i] += kCostSmoothing * (std::min(seconds, kSpikeClip * seconds_[i]) - seconds_[i]);
        return;
    }
    rows_.insert(it, rows);
    seconds_.insert(seconds_.begin() + static_cast<long>(i), seconds);
}

int PassCostCurve::next_measured(int rows) const {
    const auto it = std::upper_bound(rows_.begin(), rows_.end(), rows);
    return it == rows_.end() ? 0 : *it;
}

double PassCostCurve::seconds(int rows) const {
    if (rows_.empty()) return 0.0;
    if (rows_.size() == 1) return seconds_[0] * std::max(1.0, static_cast<double>(rows) / rows_[0]);
    const auto it = std::lower_bound(rows_.begin(), rows_.end(), rows);
    if (it != rows_.end() && *it == rows) return seconds_[static_cast<size_t>(it - rows_.begin())];
    // The segment around `rows` (or the first / last one, extended).
    size_t hi = static_cast<size_t>(it - rows_.begin());
    hi = std::clamp<size_t>(hi, 1, rows_.size() - 1);
    const size_t lo = hi - 1;
    const double slope = (seconds_[hi] - seconds_[lo]) / (rows_[hi] - rows_[lo]);
    const double out = seconds_[lo] + slope * (rows - rows_[lo]);
    return std::max(out, rows < rows_[0] ? 0.0 : seconds_[lo]);  // never cheaper than fewer rows
}

std::vector<int> batch_draft_lengths(const std::vector<std::vector<double>>& gains, const PassCostCurve& cost,
                                     int base_rows, double base_tokens, bool probe) {
    std::vector<std::pair<double, size_t>> all;  // (gain, sequence)
    for (size_t i = 0; i < gains.size(); ++i) {
        for (double g : gains[i]) all.emplace_back(g, i);
    }
    // Largest first; within a sequence gains never increase, so any top-m set is a prefix of
    // each sequence's draft (ties keep the earlier token: stable sort, listed in order).
    std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    size_t best_m = 0;
    double tokens = base_tokens, best_rate = tokens / std::max(1e-12, cost.seconds(base_rows));
    for (size_t m = 1; m <= all.size(); ++m) {
        tokens += all[m - 1].first;
        const double rate = tokens / std::max(1e-12, cost.seconds(base_rows + static_cast<int>(m)));
        if (rate > best_rate) {
            best_rate = rate;
            best_m = m;
        }
    }
    if (probe && best_m < all.size()) {
        const int next = cost.next_measured(base_rows + static_cast<int>(best_m));
        best_m = next > 0 ? std::min(all.size(), static_cast<size_t>(next - base_rows)) : all.size();
    }
    std::vector<int> lengths(gains.size(), 0);
    for (size_t m = 0; m < best_m; ++m) ++lengths[all[m].second];
    return lengths;
}

std::vector<int> plan_prefill(const std::vector<int>& remaining, bool others_running, int chunk) {
    std::vector<int> take(remaining.size(), 0);
    for (size_t i = 0; i < remaining.size(); ++i) {
        if (remaining[i] == 0) continue;  // a cached prompt: joins at once, costs nothing
        take[i] = others_running ? std::min(remaining[i], std::max(1, chunk)) : remaining[i];
        break;  // one prompt per step: its first token comes before the next prompt is read
    }
    return take;
}

}  // namespace localspec
