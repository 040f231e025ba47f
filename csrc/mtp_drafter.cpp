#include "mtp_drafter.h"

#include <gguf.h>

#include <algorithm>
#include <cstring>

#include "errors.h"
#include "sampling.h"

namespace localspec {

namespace {

constexpr size_t kMaxBacklogBytes = size_t{64} << 20;  // target states waiting for the MTP layers

// Architectures whose MTP graph localspec has read in the pinned llama.cpp (src/models/*.cpp)
// and runs with one NextN block; their memory drops a suffix like any attention model.
constexpr const char* kSupported[] = {"glm4moe", "deepseek2"};
// MTP families whose trunk keeps a recurrent state (hybrid memory).
constexpr const char* kHybrid[] = {"qwen35", "qwen35moe", "qwen3next", "nemotron_h_moe", "glm5next"};

bool listed(const std::string& arch, const char* const* begin, const char* const* end) {
    return std::any_of(begin, end, [&](const char* a) { return arch == a; });
}

struct GgufHeader {
    gguf_context* gguf = nullptr;
    explicit GgufHeader(const std::string& path) {
        gguf_init_params params{true, nullptr};
        gguf = gguf_init_from_file(path.c_str(), params);
        if (!gguf) throw UserError(ErrorKind::ModelLoad, "could not read '" + path + "' as a GGUF file; check the path.");
    }
    ~GgufHeader() {
        if (gguf) gguf_free(gguf);
    }
    GgufHeader(const GgufHeader&) = delete;
    GgufHeader& operator=(const GgufHeader&) = delete;
    std::string str(const std::string& key) const {
        const int64_t k = gguf_find_key(gguf, key.c_str());
        return k >= 0 && gguf_get_kv_type(gguf, k) == GGUF_TYPE_STRING ? gguf_get_val_str(gguf, k) : "";
    }
    int64_t u32(const std::string& key) const {
        const int64_t k = gguf_find_key(gguf, key.c_str());
        if (k < 0) return 0;
        if (gguf_get_kv_type(gguf, k) == GGUF_TYPE_UINT32) return gguf_get_val_u32(gguf, k);
        if (gguf_get_kv_type(gguf, k) == GGUF_TYPE_INT32) return gguf_get_val_i32(gguf, k);
        return 0;
    }
    bool has_tensor(const std::string& name) const { return gguf_find_tensor(gguf, name.c_str()) >= 0; }
};

}  // namespace

std::string mtp_unsupported(const std::string& path) {
    const GgufHeader header(path);
    const std::string arch = header.str("general.architecture");
    const int64_t n_nextn = header.u32(arch + ".nextn_predict_layers");
    const int64_t n_block = header.u32(arch + ".block_count");
    const std::string who = "'" + path + "'";
    if (n_nextn <= 0) {
        return who + " has no MTP (NextN) layers; use --draft ngram, a draft model or an EAGLE-3 head.";
    }
    const std::string last = "blk." + std::to_string(n_block - 1) + ".nextn.";
    if (!header.has_tensor(last + "eh_proj.weight") || !header.has_tensor(last + "enorm.weight") ||
        !header.has_tensor(last + "hnorm.weight")) {
        return who + " declares MTP layers but its conversion left their weights out; use a GGUF that keeps them.";
    }
    if (listed(arch, std::begin(kHybrid), std::end(kHybrid))) {
        return who + " is a hybrid model (" + arch +
               "), whose memory cannot take back rejected draft tokens; use --draft none.";
    }
    if (!listed(arch, std::begin(kSupported), std::end(kSupported)) || n_nextn != 1) {
        return "localspec's MTP drafter runs one NextN layer of glm4moe or deepseek2 models, not the " +
               std::to_string(n_nextn) + " of " + who + " (" + arch + "); use another drafter.";
    }
    return nextn_extension_missing();
}

MtpDrafter::MtpDrafter(const Model& target_model, Context& target, int n_threads, bool sample, float p_min)
    : target_(target), ctx_(target_model, target, n_threads), sample_(sample), p_min_(p_min) {
    if (target.feature_width() != ctx_.n_embd()) {
        throw std::logic_error("the target context does not record the hidden states the MTP layers read");
    }
}

// Make the context hold entries 0 .. n_commit-1 from the target's states (entry q needs h[q] and
// the state at q - 1, which the target recorded). States already dropped (a new request that
// rewrote an old prefix, or decodes with recording off) are zeros: a weaker draft there, never a
// wrong output.
void MtpDrafter::commit(const std::vector<Token>& history, size_t n_commit) {
    const size_t from = static_cast<size_t>(ctx_.n_positions());
    if (from >= n_commit) return;
    const size_t width = static_cast<size_t>(ctx_.n_embd());
    h_.assign((n_commit - from) * width, 0.0f);
    const size_t n_states = target_.kv_tokens().size();
    for (size_t q = std::max<size_t>(from, 1); q < n_commit; ++q) {
        const size_t p = q - 1;
        if (p < target_.features_begin() || p >= n_states) continue;
        std::copy_n(target_.features(p), width, h_.begin() + static_cast<long>((q - from) * width));
    }
    ctx_.decode(history.data() + from, h_.data(), static_cast<int>(n_commit - from));
    committed_ = n_commit;
    seen_.assign(history.begin(), history.begin() + static_cast<long>(n_commit));
    target_.drop_features_before(n_commit - 1);  // the next entry, n_commit, reads the state at n_commit - 1
}

// Entry q stays valid while the history it was made from does (it read h[0..q]).
void MtpDrafter::rollback(const std::vector<Token>& history) {
    size_t common = 0;
    while (common < seen_.size() && common < history.size() && seen_[common] == history[common]) ++common;
    committed_ = std::min(committed_, common);
    seen_.resize(committed_);
    ctx_.truncate(static_cast<int>(committed_));
    const size_t n_states = target_.kv_tokens().size();
    const size_t backlog = n_states - std::min(n_states, std::max(committed_, target_.features_begin()));
    if (backlog * static_cast<size_t>(ctx_.n_embd()) * sizeof(float) > kMaxBacklogBytes) {
        commit(history, std::min(history.size(), n_states + 1));
    }
}

// The next draft token from the newest entry's distribution: the argmax, or a sample from the
// warped q; -1 when the layers are unsure (top probability below p_min).
Token MtpDrafter::next_token(const SamplingParams& params, Rng& rng, bool sampled, Draft& out) {
    const float* logits = ctx_.logits();
    const int n_vocab = ctx_.n_vocab();
    if (!sampled) {
        const Token best = argmax(logits, n_vocab);
        if (p_min_ > 0 && top_probability(logits, n_vocab, best) < p_min_) return -1;
        return best;
    }
    Distribution q = warp(logits, n_vocab, params);
    if (q.probs.front() < p_min_) return -1;
    const Token id = sample(q, rng);
    out.q.push_back(std::move(q));
    return id;
}

Draft MtpDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    Draft out;
    out.kind = DraftKind::mtp();
    const size_t n = history.size();
    // The target's cache holds h[0..n-2], so their states are recorded.
    if (k <= 0 || n < 1 || target_.kv_tokens().size() + 1 < n) return out;
    const bool sampled = sample_ && !params.greedy();
    // Drop the previous draft's speculative entries and any made from a different history, then
    // commit up to the seed entry n-1 (always recomputed here: its output gives d_1).
    rollback(history);
    committed_ = std::min(committed_, n - 1);
    ctx_.truncate(static_cast<int>(committed_));
    commit(history, n);
    for (int i = 0; i < k; ++i) {
        const Token token = next_token(params, rng, sampled, out);
        if (token < 0) break;
        out.tokens.push_back(token);
        if (i + 1 == k || ctx_.n_positions() >= target_.n_ctx()) break;
        // Entry n+i: (d_{i+1}, the state the previous entry ended in).
        h_.assign(ctx_.state(), ctx_.state() + ctx_.n_embd());
        ctx_.decode(&token, h_.data(), 1);
    }
    return out;
}

}  // namespace localspec
