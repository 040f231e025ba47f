#include "sample/acceptance.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace localspec {

Acceptance accept_greedy(const std::vector<Token>& drafts, const std::vector<Token>& target_argmax) {
    if (target_argmax.size() != drafts.size() + 1) throw std::invalid_argument("need k + 1 target rows");
    Acceptance out;
    while (out.n_accepted < static_cast<int>(drafts.size()) &&
           drafts[static_cast<size_t>(out.n_accepted)] == target_argmax[static_cast<size_t>(out.n_accepted)]) {
        ++out.n_accepted;
    }
    out.token = target_argmax[static_cast<size_t>(out.n_accepted)];
    out.bonus = out.n_accepted == static_cast<int>(drafts.size());
    return out;
}

Acceptance accept_greedy(const std::vector<Token>& drafts, const TargetArgmax& target_argmax) {
    Acceptance out;
    for (size_t i = 0;; ++i) {
        const Token best = target_argmax(i);
        if (i < drafts.size() && drafts[i] == best) {
            ++out.n_accepted;
            continue;
        }
        out.token = best;
        out.bonus = i == drafts.size();
        return out;
    }
}

Distribution residual(const Distribution& p, const Distribution& q) {
    // max(0, p - q) is zero outside supp(p), so only p's support needs q's values.
    std::unordered_map<Token, float> q_of;
    q_of.reserve(q.size() * 2);
    for (size_t i = 0; i < q.size(); ++i) q_of[q.ids[i]] = q.probs[i];

    Distribution out;
    double mass = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
        auto it = q_of.find(p.ids[i]);
        const double diff = static_cast<double>(p.probs[i]) - (it == q_of.end() ? 0.0 : it->second);
        if (diff > 0.0) {
            out.ids.push_back(p.ids[i]);
            out.probs.push_back(static_cast<float>(diff));
            mass += diff;
        }
    }
    if (mass <= 0.0) return p;
    for (float& v : out.probs) v = static_cast<float>(v / mass);
    return out;
}

namespace {

Distribution point_mass(Token token) {
    Distribution d;
    d.ids = {token};
    d.probs = {1.0f};
    return d;
}

}  // namespace

Acceptance accept_sampled(const std::vector<Token>& drafts, const TargetRow& p,
                          const std::vector<Distribution>& q, Rng& rng) {
    const size_t k = drafts.size();
    if (!q.empty() && q.size() < k) throw std::invalid_argument("need one draft distribution per draft");
    Acceptance out;
    for (size_t i = 0; i < k; ++i) {
        const Token d = drafts[i];
        const Distribution p_i = p(i);
        const double p_d = p_i.prob(d);
        const double q_d = q.empty() ? 1.0 : q[i].prob(d);
        // u < p/q accepts with probability min(1, p/q); q_d == 0 cannot be drawn from q.
        if (q_d > 0.0 && rng.uniform() * q_d < p_d) {
            ++out.n_accepted;
            continue;
        }
        out.token = sample(residual(p_i, q.empty() ? point_mass(d) : q[i]), rng);
        return out;
    }
    out.token = sample(p(k), rng);
    out.bonus = true;
    return out;
}

Acceptance accept_coupled(const std::vector<Token>& drafts, const TargetRow& p, const std::vector<double>& u) {
    const size_t k = drafts.size();
    if (u.size() != k + 1) throw std::invalid_argument("need k + 1 uniforms");
    Acceptance out;
    for (size_t i = 0; i <= k; ++i) {
        const Token target = sample_at(p(i), u[i]);
        if (i < k && target == drafts[i]) {
            ++out.n_accepted;
            continue;
        }
        out.token = target;
        out.bonus = i == k;
        return out;
    }
    return out;  // unreachable: the loop returns at i == k at the latest
}

Acceptance accept_sampled(const std::vector<Token>& drafts, const std::vector<Distribution>& p,
                          const std::vector<Distribution>& q, Rng& rng) {
    if (p.size() != drafts.size() + 1) throw std::invalid_argument("need k + 1 target distributions");
    return accept_sampled(drafts, [&p](size_t i) { return p[i]; }, q, rng);
}

}  // namespace localspec
