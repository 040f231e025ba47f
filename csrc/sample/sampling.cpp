#include "sample/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <unordered_map>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace localspec {

float Distribution::prob(Token id) const {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == id) return probs[i];
    }
    return 0.0f;
}

uint64_t Rng::next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

// The first index of the largest logit, as std::max_element finds it, without its branch per
// value: with ~10^5 logits a row the mispredicted branches cost ~1 ms a row here, most of a
// verification row's cost outside the target pass. Pass 1 takes the maximum 16 lanes at a
// time (the compiler turns the loop into vector max instructions; NaN never wins a `>`);
// pass 2 finds the maximum's first occurrence.
Token argmax(const float* logits, int n_vocab) {
    constexpr int kLanes = 16;
    float lane_max[kLanes];
    std::fill(lane_max, lane_max + kLanes, -INFINITY);
    const int n_full = n_vocab / kLanes * kLanes;
    for (int i = 0; i < n_full; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) {
            const float x = logits[i + j];
            lane_max[j] = x > lane_max[j] ? x : lane_max[j];
        }
    }
    float best = -INFINITY;
    for (const float x : lane_max) best = x > best ? x : best;
    for (int i = n_full; i < n_vocab; ++i) best = logits[i] > best ? logits[i] : best;
    const float* end = logits + n_vocab;
    const float* first = std::find(logits, end, best);
    if (first == end) return static_cast<Token>(std::max_element(logits, end) - logits);  // all NaN
    return static_cast<Token>(first - logits);
}

// ---- top_probability: 1 / sum_i exp(logit_i - max) ----------------------------------------
//
// With ~10^5 logits, one double exp per logit costs ~1 ms, as much as a small draft model's
// pass on a GPU. With AVX2 the exponentials run 8 at a time: exp(x) = 2^n * e^r with
// n = round(x / ln 2), r reduced in two steps (Cody-Waite) and e^r from Cephes' degree-6
// polynomial (relative error ~2e-7). Partial sums stay in float for 1024 values at a time,
// then go into a double.

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOCALSPEC_X86 1

__attribute__((target("avx2,fma"))) __m256 exp_avx2(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // below: e^x < 2^-125, counted as that
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// Sum of exp(logit - max_logit) over the first n / 8 * 8 logits.
__attribute__((target("avx2,fma"))) double exp_sum_avx2(const float* logits, int n, float max_logit) {
    const __m256 shift = _mm256_set1_ps(max_logit);
    double total = 0.0;
    for (int start = 0; start + 8 <= n; start += 1024) {
        const int end = std::min(n / 8 * 8, start + 1024);
        __m256 acc = _mm256_setzero_ps();
        for (int i = start; i < end; i += 8) acc = _mm256_add_ps(acc, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(logits + i), shift)));
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, acc);
        for (const float v : lanes) total += v;
    }
    return total;
}

bool cpu_has_avx2() {
    static const bool has = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }();
    return has;
}

#endif

}  // namespace

float top_probability(const float* logits, int n_vocab, Token best) {
    const float max_logit = logits[best];
    double sum = 0.0;
    int i = 0;
#ifdef LOCALSPEC_X86
    if (cpu_has_avx2()) {
        sum = exp_sum_avx2(logits, n_vocab, max_logit);
        i = n_vocab / 8 * 8;
    }
#endif
    for (; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
    return static_cast<float>(1.0 / sum);
}

namespace {

// Softmax of `logits[ids]` scaled by 1/temperature, in place into `out` (doubles for accuracy).
void softmax(const float* logits, const std::vector<Token>& ids, double inv_temp, std::vector<double>& out) {
    out.resize(ids.size());
    double max_logit = -INFINITY;
    for (Token id : ids) max_logit = std::max(max_logit, static_cast<double>(logits[id]));
    double sum = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
        out[i] = std::exp((static_cast<double>(logits[ids[i]]) - max_logit) * inv_temp);
        sum += out[i];
    }
    for (double& v : out) v /= sum;
}

// The top k ids in one pass over the logits. A heap keeps the k best so far with the worst on
// top. Ids are scanned in increasing order, so a later id with the same logit as the worst
// ranks below it: a value enters only when strictly greater than the worst logit. Blocks of
// 16 with no such value are skipped without a branch per value (after the first blocks,
// nearly all of them); the result is exactly what a full sort would keep.
std::vector<Token> top_k_ids(const float* logits, int n_vocab, size_t k,
                             const std::function<bool(Token, Token)>& by_logit) {
    std::vector<Token> heap;
    heap.reserve(k);
    int i = 0;
    for (; i < n_vocab && heap.size() < k; ++i) {
        heap.push_back(i);
        std::push_heap(heap.begin(), heap.end(), by_logit);
    }
    constexpr int kBlock = 16;
    float worst = logits[heap.front()];
    for (; i < n_vocab; i += kBlock) {
        const int end = std::min(n_vocab, i + kBlock);
        if (end - i == kBlock) {
            int greater = 0;  // an OR over compares: vector instructions, no branch per value
            for (int j = 0; j < kBlock; ++j) greater |= logits[i + j] > worst;
            if (!greater) continue;
        }
        for (int j = i; j < end; ++j) {
            if (!(logits[j] > worst)) continue;
            std::pop_heap(heap.begin(), heap.end(), by_logit);
            heap.back() = j;
            std::push_heap(heap.begin(), heap.end(), by_logit);
            worst = logits[heap.front()];
        }
    }
    std::sort_heap(heap.begin(), heap.end(), by_logit);  // best first
    return heap;
}

// Candidate ids sorted by descending logit (ties by id); only the top k when k > 0.
std::vector<Token> sorted_candidates(const float* logits, int n_vocab, int top_k) {
    const std::function<bool(Token, Token)> by_logit = [logits](Token a, Token b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    if (top_k > 0 && top_k < n_vocab) return top_k_ids(logits, n_vocab, static_cast<size_t>(top_k), by_logit);
    std::vector<Token> ids(static_cast<size_t>(n_vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), by_logit);
    return ids;
}

}  // namespace

std::vector<Token> top_tokens(const float* logits, int n_vocab, int n) {
    return sorted_candidates(logits, n_vocab, std::min(n, n_vocab));
}

Distribution warp(const float* logits, int n_vocab, const SamplingParams& params) {
    std::vector<Token> ids = sorted_candidates(logits, n_vocab, params.top_k);
    std::vector<double> probs;
    softmax(logits, ids, 1.0, probs);

    size_t keep = ids.size();
    if (params.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
        double mass = 0.0;
        for (size_t i = 0; i < ids.size(); ++i) {
            mass += probs[i];
            if (mass >= params.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (params.min_p > 0.0f) {  // drop tokens below min_p times the most likely one
        const double floor = params.min_p * probs[0];
        size_t n = 1;
        while (n < keep && probs[n] >= floor) ++n;
        keep = n;
    }
    ids.resize(keep);

    softmax(logits, ids, 1.0 / static_cast<double>(params.temperature), probs);
    // Tokens a grammar forbids (logit -inf) or that underflow have p == 0: not in the support.
    while (ids.size() > 1 && probs[ids.size() - 1] <= 0.0) {
        ids.pop_back();
        probs.pop_back();
    }
    Distribution dist;
    dist.ids = std::move(ids);
    dist.probs.assign(probs.begin(), probs.end());
    return dist;
}

// warp() of a row whose tokens outside `tokens` are -infinity, computed over those tokens alone:
// their logits in argmax order (`tokens` is in that order, so a tie between two of them is
// broken by the lower id in both) give the same survivors, the same masses and the same
// softmax; the -infinity tokens only add zeros. No pass over the whole vocabulary.
Distribution warp_among(const float* logits, const std::vector<Token>& tokens, const SamplingParams& params) {
    std::vector<float> compact(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) compact[i] = logits[tokens[i]];
    Distribution d = warp(compact.data(), static_cast<int>(compact.size()), params);
    for (Token& id : d.ids) id = tokens[static_cast<size_t>(id)];
    return d;
}

// The masked row's warp keeps the top_k best allowed tokens (top-k), then the shortest prefix of
// them whose mass, normalised over those top_k, reaches top_p (top-p), then those whose logit is
// at least the best one's + ln(min_p) (min-p), and takes the softmax at the temperature over
// what is kept. The kept tokens' logits alone give that softmax, so the known tokens decide
// the distribution in two cases:
//  A. top-k: top_k tokens are known. The others come after them in warp's order (descending
//     logit, ties by id), being the caller's best candidates: lower, or tied with the last
//     candidate at a higher id than every tied candidate's. So the top_k survivors are known;
//  B. min-p: the best allowed token min-p drops is known to be dropped (a known token below
//     the best + ln(min_p), or else `bound` below it, which bounds every other token), and
//     top-p over the known tokens keeps at least every token before it. The other allowed
//     tokens only add mass to top-p's normaliser, which can only make top-p keep more (each
//     probability e_i / Z only shrinks as Z grows), so min-p still decides.
// Case B's comparisons with the min-p threshold keep a margin (kMargin, in logits) so that
// rounding in warp's own arithmetic, which normalises before it compares, cannot tip them.
bool warp_known(const float* logits, const std::vector<Token>& known, float bound, const SamplingParams& params,
                Distribution& out) {
    if (known.empty()) return false;
    const size_t k = params.top_k > 0 ? static_cast<size_t>(params.top_k) : 0;
    if (bound == -INFINITY || (k > 0 && known.size() >= k)) {  // nothing else may be sampled, or case A
        out = warp_among(logits, known, params);
        return true;
    }
    if (params.min_p <= 0.0f) return false;
    constexpr double kMargin = 1e-4;
    const double threshold = static_cast<double>(logits[known[0]]) + std::log(static_cast<double>(params.min_p));
    size_t kept = 0;  // known tokens min-p keeps (a prefix: `known` is in descending order)
    while (kept < known.size() && static_cast<double>(logits[known[kept]]) >= threshold) ++kept;
    if (kept == 0) return false;  // min_p above 1
    // The best allowed token min-p drops: a known one, or else one at most `bound` (every known
    // token is at least `bound`). Top-k keeps all the known tokens here (case A failed).
    const double first_dropped =
        kept < known.size() ? static_cast<double>(logits[known[kept]]) : static_cast<double>(bound);
    if (!(first_dropped < threshold - kMargin && static_cast<double>(logits[known[kept - 1]]) > threshold + kMargin)) {
        return false;
    }
    Distribution d = warp_among(logits, known, params);
    if (d.size() != kept) return false;  // top-p (or an underflow) cut before min-p did
    out = std::move(d);
    return true;
}

void apply_penalties(float* logits, int n_vocab, const std::vector<Token>& context, const SamplingParams& params) {
    if (!params.penalized()) return;
    const size_t n = params.penalty_last_n < 0 ? context.size()
                                               : std::min(context.size(), static_cast<size_t>(params.penalty_last_n));
    std::unordered_map<Token, int> counts;
    for (size_t i = context.size() - n; i < context.size(); ++i) ++counts[context[i]];
    for (const auto& [token, count] : counts) {
        if (token < 0 || token >= n_vocab) continue;
        float& logit = logits[token];
        logit = logit <= 0.0f ? logit * params.repeat_penalty : logit / params.repeat_penalty;
        logit -= static_cast<float>(count) * params.frequency_penalty + params.presence_penalty;
    }
}

TokenLogprob token_logprob(const float* logits, int n_vocab, Token token, int n_top) {
    const Token best = argmax(logits, n_vocab);
    // log p(x) = logit(x) - max - log(sum exp(logit - max)) = logit(x) - max + log(top probability)
    const double log_norm = static_cast<double>(logits[best]) - std::log(static_cast<double>(top_probability(logits, n_vocab, best)));
    TokenLogprob out;
    out.token = token;
    out.logprob = static_cast<float>(static_cast<double>(logits[token]) - log_norm);
    if (n_top > 0) {
        for (Token id : sorted_candidates(logits, n_vocab, std::min(n_top, n_vocab))) {
            out.top.emplace_back(id, static_cast<float>(static_cast<double>(logits[id]) - log_norm));
        }
    }
    return out;
}

Token sample(const Distribution& dist, Rng& rng) { return sample_at(dist, rng.uniform()); }

double position_uniform(uint64_t seed, uint64_t position) {
    Rng mix(seed ^ (position * 0xD1B54A32D192ED03ull));
    mix.next();
    return mix.uniform();
}

Token sample_at(const Distribution& dist, double u) {
    double cumulative = 0.0;
    for (size_t i = 0; i < dist.ids.size(); ++i) {
        cumulative += dist.probs[i];
        if (u < cumulative) return dist.ids[i];
    }
    return dist.ids.back();  // u landed in the float rounding gap at the end
}

}  // namespace localspec
