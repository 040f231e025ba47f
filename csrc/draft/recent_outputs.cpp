#include "draft/recent_outputs.h"

#include <algorithm>

namespace localspec {

int latest_continuation(const Token* tokens, int size, const Token* suffix, int n) {
    for (int start = size - n - 1; start >= 0; --start) {
        if (std::equal(suffix, suffix + n, tokens + start)) return start + n;
    }
    return -1;
}

void RecentOutputs::add(const std::vector<Token>& output) {
    if (capacity_ == 0 || output.size() < 2) return;
    const size_t keep = std::min(output.size(), capacity_);
    outputs_.emplace_front(output.end() - static_cast<long>(keep), output.end());
    tokens_ += keep;
    while (tokens_ > capacity_) {
        tokens_ -= outputs_.back().size();
        outputs_.pop_back();
    }
}

// One scan per n over every stored output, newest first and each from its end: the most recent
// occurrence predicts best, as in the context lookup. O(stored tokens x n) per n, a fraction of
// a millisecond for the default capacity; only reached when the context itself has no match.
std::vector<Token> RecentOutputs::lookup(const std::vector<Token>& context, int n_min, int n_max, int k,
                                         int& n_found) const {
    const int len = static_cast<int>(context.size());
    if (k <= 0 || outputs_.empty()) return {};
    for (int n = std::min(n_max, len); n >= std::max(1, n_min); --n) {
        const Token* suffix = context.data() + (len - n);
        for (const std::vector<Token>& output : outputs_) {
            const int size = static_cast<int>(output.size());
            const int from = latest_continuation(output.data(), size, suffix, n);
            if (from < 0) continue;
            n_found = n;
            return std::vector<Token>(output.begin() + from, output.begin() + from + std::min(k, size - from));
        }
    }
    return {};
}

}  // namespace localspec
