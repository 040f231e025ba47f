// The n-gram drafter: the lookup over the context, and following a repeating cycle.
#include "draft/ngram_drafter.h"

#include <algorithm>

namespace localspec {

namespace {

// The continuation after the most recent earlier occurrence of the last n tokens of
// `context` (longest n first); empty when nothing matches. `n_found` gets the match length.
std::vector<Token> lookup(const std::vector<Token>& context, int n_min, int n_max, int k, int& n_found) {
    const int len = static_cast<int>(context.size());
    for (int n = std::min(n_max, len - 1); n >= n_min; --n) {
        const int from = latest_continuation(context.data(), len, context.data() + (len - n), n);
        if (from < 0) continue;
        n_found = n;
        return std::vector<Token>(context.begin() + from, context.begin() + from + std::min(k, len - from));
    }
    return {};
}

}  // namespace

Draft NgramDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams&, Rng&) {
    return lookup_draft(history, k);
}

Draft NgramDrafter::lookup_draft(const std::vector<Token>& history, int k) {
    Draft out;
    if (k <= 0) return out;
    int n_found = 0;
    out.tokens = lookup(history, n_min_, n_max_, k, n_found);
    if (recent_ && n_found < n_max_) {  // a longer match in the recent outputs predicts better
        const int longer = out.tokens.empty() ? n_min_ : n_found + 1;
        int n_recent = 0;
        std::vector<Token> recent = recent_->lookup(history, longer, n_max_, k, n_recent);
        if (!recent.empty()) {
            out.tokens = std::move(recent);
            n_found = n_recent;
        }
    }
    out.kind = DraftKind::lookup(n_found);
    // A match whose continuation runs into the end of the context is a repeating cycle:
    // keep looking up on the context extended by the draft, so the draft follows the cycle.
    std::vector<Token> context;
    while (!out.tokens.empty() && static_cast<int>(out.tokens.size()) < k) {
        if (context.empty()) context = history;
        context.resize(history.size());
        context.insert(context.end(), out.tokens.begin(), out.tokens.end());
        int n_more = 0;
        std::vector<Token> more = lookup(context, n_max_, n_max_, k - static_cast<int>(out.tokens.size()), n_more);
        if (more.empty()) break;
        out.tokens.insert(out.tokens.end(), more.begin(), more.end());
    }
    return out;
}

}  // namespace localspec
