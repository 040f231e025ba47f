// Lossless acceptance (docs/design.md, "Lossless acceptance"): pure functions of the drafts
// and the distributions.
//
// Given drafts d_1..d_k and target rows p_1..p_{k+1} (p_i is the target's distribution for the
// position of d_i; p_{k+1} follows d_k), each function returns n accepted drafts and one more
// token from the target: a correction (some d_i was rejected) or a bonus (all k accepted).
// Either way a step emits n + 1 tokens.
#pragma once

#include <functional>
#include <vector>

#include "sample/sampling.h"

namespace localspec {

struct Acceptance {
    int n_accepted = 0;
    Token token = -1;    // the correction or bonus token
    bool bonus = false;  // true: all drafts accepted and `token` came from p_{k+1}
};

// Greedy: accept d_i while d_i == argmax p_i; the first mismatch is replaced by argmax p_i.
// target_argmax has k + 1 entries.
Acceptance accept_greedy(const std::vector<Token>& drafts, const std::vector<Token>& target_argmax);

// The same rule with row i's argmax computed on demand: rows after the first mismatch are
// never read (a grammar cannot even be advanced past a draft it forbids).
using TargetArgmax = std::function<Token(size_t)>;
Acceptance accept_greedy(const std::vector<Token>& drafts, const TargetArgmax& target_argmax);

// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023). Accept d_i with probability
// min(1, p_i(d_i) / q_i(d_i)); on the first rejection sample the correction from
// norm(max(0, p_i - q_i)); after k acceptances sample the bonus from p_{k+1}.
// Then P(emit x) = q(x) min(1, p/q) + (1 - sum_y min(p, q)) * max(0, p - q)(x) / Z = p(x).
// `q` empty means a deterministic drafter (q_i is a point mass on d_i): accept with p_i(d_i)
// and the correction comes from p_i with d_i removed.
Acceptance accept_sampled(const std::vector<Token>& drafts, const std::vector<Distribution>& p,
                          const std::vector<Distribution>& q, Rng& rng);
// The same rule with p_i computed on demand: rows after the first rejection are never warped.
using TargetRow = std::function<Distribution(size_t)>;
Acceptance accept_sampled(const std::vector<Token>& drafts, const TargetRow& p,
                          const std::vector<Distribution>& q, Rng& rng);

// Deterministic drafts (q a point mass on each d_i), with one uniform u_i per position: the
// target's token at position i is the inverse-CDF sample of p_i at u_i, and d_i is accepted iff
// it equals that token. P(accept d_i) = p_i(d_i) and the correction is distributed as p_i
// without d_i, exactly as rejection sampling with a point mass; in addition the emitted tokens
// are the ones plain sampling with the same uniforms would emit, whatever the draft length, so
// a seed reproduces the output. `u` has k + 1 entries.
Acceptance accept_coupled(const std::vector<Token>& drafts, const TargetRow& p, const std::vector<double>& u);

// norm(max(0, p - q)); falls back to p when the residual has no mass (p == q).
Distribution residual(const Distribution& p, const Distribution& q);

}  // namespace localspec
