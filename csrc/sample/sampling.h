// Turning logits into the distribution we sample from ("warping"), and seeded sampling.
// The SAME warp is applied to target logits (p) and draft logits (q): that is what makes
// speculative sampling lossless with respect to the warped target distribution.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "llama/llama_backend.h"

namespace localspec {

struct SamplingParams {
    float temperature = 0.8f;  // 0: greedy (argmax of the raw logits)
    int top_k = 40;            // 0: off
    float top_p = 0.95f;       // 1: off
    float min_p = 0.05f;       // 0: off
    uint64_t seed = 0;
    // Penalties (llama.cpp's semantics), judged over the last penalty_last_n tokens before the
    // position (prompt and generated alike; -1: the whole context, 0: off). A token seen c > 0
    // times there has its logit divided by repeat_penalty (multiplied when the logit is <= 0),
    // then lowered by c * frequency_penalty + presence_penalty. They shape the logits before
    // everything else, greedy included.
    float repeat_penalty = 1.0f;     // 1: off
    float frequency_penalty = 0.0f;  // 0: off
    float presence_penalty = 0.0f;   // 0: off
    int penalty_last_n = 64;

    bool greedy() const { return temperature <= 0.0f; }
    bool penalized() const {
        return penalty_last_n != 0 && (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
    }
};

// A probability distribution over token ids, listing only tokens with p > 0,
// in descending probability. Probabilities sum to 1.
struct Distribution {
    std::vector<Token> ids;
    std::vector<float> probs;

    float prob(Token id) const;  // 0 for tokens outside the support
    size_t size() const { return ids.size(); }
};

// Deterministic RNG: same seed, same stream on every platform (no std:: distributions).
class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next();        // splitmix64
    double uniform();       // in [0, 1)

private:
    uint64_t state_;
};

// Order as llama.cpp's default chain: top-k -> top-p -> min-p (all judged on the softmax at
// temperature 1 of the survivors) -> temperature -> softmax.
Distribution warp(const float* logits, int n_vocab, const SamplingParams& params);

// warp() of a row of which only some tokens may be sampled, when that is decided by the few
// of them that are known: `known` lists, in argmax order, the allowed tokens among the row's
// best candidates (top_tokens(): every other token ranks after them), and every allowed token
// outside `known` has a logit at most `bound` (-infinity: there is none). Reads `logits` at the
// known tokens only. Returns false, leaving `out` alone, when the other allowed tokens could
// change the distribution (then mask the whole row); otherwise `out` is bit for bit what warp()
// of the fully masked row gives.
bool warp_known(const float* logits, const std::vector<Token>& known, float bound, const SamplingParams& params,
                Distribution& out);

// Apply the penalties in place to `logits`, for the position that follows `context` (its last
// penalty_last_n tokens count). Does nothing when !params.penalized().
void apply_penalties(float* logits, int n_vocab, const std::vector<Token>& context, const SamplingParams& params);

// log softmax(logits)[token] at temperature 1 over the whole vocabulary, and the n_top most
// likely tokens with theirs (best first): what OpenAI's logprobs / top_logprobs report.
struct TokenLogprob {
    Token token = -1;
    float logprob = 0.0f;
    std::vector<std::pair<Token, float>> top;
};
TokenLogprob token_logprob(const float* logits, int n_vocab, Token token, int n_top);

Token argmax(const float* logits, int n_vocab);
// The n highest logits' ids, best first (ties: lower id first), in one pass over the logits.
std::vector<Token> top_tokens(const float* logits, int n_vocab, int n);
// The probability of token `best` (the argmax) under softmax(logits) at temperature 1, to
// about 1e-6 relative (a draft model's confidence cutoff).
float top_probability(const float* logits, int n_vocab, Token best);
Token sample(const Distribution& dist, Rng& rng);
// Inverse-CDF sample with a given uniform u in [0, 1) (the distribution's own order).
Token sample_at(const Distribution& dist, double u);
// A uniform in [0, 1) that depends only on (seed, position): the randomness used for the
// token at a position does not depend on how generation was split into steps.
double position_uniform(uint64_t seed, uint64_t position);

}  // namespace localspec
