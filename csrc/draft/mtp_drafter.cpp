#include "draft/mtp_drafter.h"

#include <gguf.h>

#include <algorithm>
#include <cstring>

#include "base/errors.h"
#include "sample/sampling.h"

namespace localspec {

namespace {

constexpr size_t kMaxBacklogBytes = size_t{64} << 20;  // target states waiting for the MTP layers

// Architectures whose MTP graph localspec has read in the pinned llama.cpp (src/models/*.cpp)
// and runs; their memory drops a suffix (attention) or rolls back through state snapshots (the
// hybrid Qwen ones: Context::rollback_depth; their MTP context has a plain KV cache). These
// build one NextN block only (their graphs assert it); hy_v3 selects its block with
// llama_set_nextn_layer_offset, so draft position i runs block i (chained).
constexpr const char* kSingle[] = {"glm4moe", "deepseek2", "qwen35", "qwen35moe", "qwen3next"};
constexpr const char* kChained[] = {"hy_v3"};

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
    for (int64_t block = n_block - n_nextn; block < n_block; ++block) {
        const std::string p = "blk." + std::to_string(block) + ".nextn.";
        if (!header.has_tensor(p + "eh_proj.weight") || !header.has_tensor(p + "enorm.weight") ||
            !header.has_tensor(p + "hnorm.weight")) {
            return who + " declares MTP layers but its conversion left their weights out; use a GGUF that keeps them.";
        }
    }
    const bool single = listed(arch, std::begin(kSingle), std::end(kSingle));
    if (single && n_nextn != 1) {
        return "llama.cpp's " + arch + " MTP graph runs one NextN layer, and " + who + " has " +
               std::to_string(n_nextn) + "; use another drafter.";
    }
    if (!single && !listed(arch, std::begin(kChained), std::end(kChained))) {
        return "localspec's MTP drafter runs the NextN layers of glm4moe, deepseek2, qwen35, qwen35moe, qwen3next "
               "and hy_v3 models, not those of " +
               who + " (" + arch + "); use another drafter.";
    }
    return nextn_extension_missing();
}

MtpDrafter::MtpDrafter(const Model& target_model, Context& target, int n_threads, bool sample, float p_min, int slot)
    : target_(target), ctx_(target_model, target, n_threads), slot_(slot), sample_(sample), p_min_(p_min) {
    if (target.feature_width() != ctx_.n_embd()) {
        throw std::logic_error("the target context does not record the hidden states the MTP layers read");
    }
}

// Make the context hold entries 0 .. n_commit-1 from the target's states, in every NextN layer
// (entry q needs h[q] and the state at q - 1, which the target recorded); layer 0 last, so that
// logits() and state() are its output for entry n_commit-1. States already dropped (a new
// request that rewrote an old prefix, or decodes with recording off) are zeros: a weaker draft
// there, never a wrong output.
void MtpDrafter::commit(const std::vector<Token>& history, size_t n_commit) {
    const size_t from = static_cast<size_t>(ctx_.n_positions());
    if (from >= n_commit) return;
    const size_t width = static_cast<size_t>(ctx_.n_embd());
    h_.assign((n_commit - from) * width, 0.0f);
    const size_t n_states = target_.kv_tokens(slot_).size();
    for (size_t q = std::max<size_t>(from, 1); q < n_commit; ++q) {
        const size_t p = q - 1;
        if (p < target_.features_begin(slot_) || p >= n_states) continue;
        std::copy_n(target_.features(p, slot_), width, h_.begin() + static_cast<long>((q - from) * width));
    }
    for (int layer = ctx_.n_layers() - 1; layer >= 0; --layer) {
        ctx_.truncate(static_cast<int>(from));  // the cells the previous layer wrote, refilled in order
        ctx_.decode(history.data() + from, h_.data(), static_cast<int>(n_commit - from), layer);
    }
    committed_ = n_commit;
    seen_.assign(history.begin(), history.begin() + static_cast<long>(n_commit));
    target_.drop_features_before(n_commit - 1, slot_);  // the next entry, n_commit, reads the state at n_commit - 1
}

// Entry q stays valid while the history it was made from does (it read h[0..q]).
void MtpDrafter::rollback(const std::vector<Token>& history) {
    size_t common = 0;
    while (common < seen_.size() && common < history.size() && seen_[common] == history[common]) ++common;
    committed_ = std::min(committed_, common);
    seen_.resize(committed_);
    ctx_.truncate(static_cast<int>(committed_));
    const size_t n_states = target_.kv_tokens(slot_).size();
    const size_t backlog = n_states - std::min(n_states, std::max(committed_, target_.features_begin(slot_)));
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

const float* MtpDrafter::seed_logits(const std::vector<Token>& history) {
    // Drop the previous draft's speculative entries and any made from a different history, then
    // commit up to the seed entry n-1 (always recomputed here: its output gives d_1).
    rollback(history);
    committed_ = std::min(committed_, history.size() - 1);
    ctx_.truncate(static_cast<int>(committed_));
    commit(history, history.size());
    return ctx_.logits();
}

// Entries n .. n+i-1 after the seed: (d_j, the state the entry before ended in), through layer
// i when the layers chain (each layer holds its own keys and values there), else layer 0,
// appending one entry per step.
void MtpDrafter::extend(const std::vector<Token>& drafted, size_t n) {
    const size_t width = static_cast<size_t>(ctx_.n_embd());
    const int layer = std::min(static_cast<int>(drafted.size()), ctx_.n_layers() - 1);
    chain_.insert(chain_.end(), ctx_.state(), ctx_.state() + width);
    if (layer == 0) {
        ctx_.decode(&drafted.back(), chain_.data() + chain_.size() - width, 1, 0);
        return;
    }
    ctx_.truncate(static_cast<int>(n));
    ctx_.decode(drafted.data(), chain_.data(), static_cast<int>(drafted.size()), layer);
}

Draft MtpDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    Draft out;
    out.kind = DraftKind::mtp();
    const size_t n = history.size();
    // The target's cache holds h[0..n-2], so their states are recorded.
    if (k <= 0 || n < 1 || target_.kv_tokens(slot_).size() + 1 < n) return out;
    const bool sampled = sample_ && !params.greedy();
    seed_logits(history);
    chain_.clear();
    // Layers that chain draft as many tokens as there are layers (position i: layer i).
    const int k_max = ctx_.n_layers() > 1 ? std::min(k, ctx_.n_layers()) : k;
    for (int i = 0; i < k_max; ++i) {
        const Token token = next_token(params, rng, sampled, out);
        if (token < 0) break;
        out.tokens.push_back(token);
        if (i + 1 == k_max || n + static_cast<size_t>(i) >= static_cast<size_t>(target_.n_ctx())) break;
        extend(out.tokens, n);
    }
    return out;
}

std::vector<float> mtp_first_logits(const std::string& target_path, const std::vector<Token>& tokens, int n_threads) {
    ModelOptions model_options{target_path, 0};
    model_options.load_mtp = true;
    const Model model(model_options);
    ContextOptions options;
    options.n_ctx = std::max<int>(64, static_cast<int>(tokens.size()) + 8);
    options.n_threads = n_threads;
    options.nextn_features = true;
    Context target(model, options);
    target.decode(tokens, 1);
    MtpDrafter drafter(model, target, n_threads, false, 0.0f);
    const size_t n_vocab = static_cast<size_t>(target.n_vocab());
    std::vector<float> out;
    out.reserve(tokens.size() * n_vocab);
    for (size_t n = 1; n <= tokens.size(); ++n) {
        const std::vector<Token> history(tokens.begin(), tokens.begin() + static_cast<long>(n));
        const float* row = drafter.seed_logits(history);
        out.insert(out.end(), row, row + n_vocab);
    }
    return out;
}

}  // namespace localspec
