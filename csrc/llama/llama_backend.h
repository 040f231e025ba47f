// The thin layer over llama.cpp's C API. This header exposes plain C++ types only; its source
// files (log, model, extensions, context, head_context, mtp_context, quantize, grammar .cpp,
// sharing impl.h) are csrc/llama/, the only folder that includes llama.h. ggml's own headers are
// read elsewhere too (the kernels, RPC, the EAGLE-3 head, the MTP drafter, the feature collector).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llama/feature_log.h"

struct llama_token_data_array;  // llama.h's, for Grammar's private apply

namespace localspec {

using Token = int32_t;

// Route llama.cpp's log: errors are remembered (for error messages), everything is printed
// only when verbose. Call once per process before loading models; idempotent.
void backend_init(bool verbose);

struct ModelOptions {
    std::string path;
    int n_gpu_layers = -1;  // -1: as many as the backend can hold (all); 0: CPU only
    bool vocab_only = false;  // metadata and vocabulary only (no weights)
    // llama.cpp's repacked weight layouts on the CPU (use_extra_bufts): faster batches, but a
    // row's bits then depend on how many rows share the pass (docs/exact.md).
    bool repack = true;
    // Which matrices go to localspec's buffer type (body_matmul.h): 0 none, else a
    // BodyKernelClaim::Scope. Where that type is unavailable the matrices stay llama.cpp's
    // (exact mode then relies on ggml's reference kernels alone).
    int body_kernels = 0;
    // Load the model's MTP (NextN) layers too (llama.cpp skips them by default): the MTP
    // drafter runs them in its own context (MtpContext).
    bool load_mtp = false;
    // RPC workers (HOST:PORT, rpc.h) lending devices: the layers are spread over their devices
    // first, then the local GPUs; the output layer stays local (in host memory when there is no
    // local GPU, where localspec's own head reads it).
    std::vector<std::string> rpc;
};

struct VocabInfo {
    int type = 0;  // llama_vocab_type
    int n_tokens = 0;
    Token bos = -1;
    Token eos = -1;
};

// A loaded GGUF model (weights + vocabulary). Immutable after load; safe to share.
class Model {
public:
    explicit Model(const ModelOptions& options);  // throws UserError(ModelLoad)
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const std::string& path() const { return path_; }
    VocabInfo vocab() const;
    std::string token_text(Token token) const;  // the vocabulary entry, as stored
    // Bytes this token renders to; `special`: control tokens as their text (what a grammar
    // matches), instead of nothing.
    std::string token_piece(Token token, bool special = false) const;
    bool is_end_of_generation(Token token) const;
    std::vector<Token> tokenize(const std::string& text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<Token>& tokens) const;
    std::string chat_template() const;  // "" when the GGUF has none
    std::string description() const;
    std::string metadata(const std::string& key) const;  // "" when absent
    int n_layer() const;
    int n_embd() const;
    std::string architecture() const;  // general.architecture
    // How the model remembers a sequence: "attention" (a KV entry per position), "recurrent"
    // (one state: Mamba, RWKV) or "hybrid" (both: Jamba, LFM2, Qwen3-Next, Qwen3.5, ...).
    std::string memory_kind() const;
    // Whether a context can drop cached positions from any n on (the KV rollback that
    // speculation needs); false for recurrent and hybrid models, which keep one running state.
    bool can_drop_suffix() const { return memory_kind() == "attention"; }

private:
    friend class Context;
    friend class HeadContext;
    friend class MtpContext;
    friend class Grammar;
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::string path_;
};

struct ContextOptions {
    int n_ctx = 4096;
    int n_batch = 2048;
    int n_threads = 0;  // 0: hardware concurrency
    // Compute every decode's logits with localspec's own head (q8_head.h, q6k_head.h) when the
    // output head is Q8_0 or Q6_K in CPU memory and the CPU can run it; llama.cpp's otherwise.
    bool fast_head = false;
    // With fast_head: logits for token ids below this alone, the rest -infinity (a draft model's
    // reduced vocabulary: HeadHook::set_row_limit). 0: the whole vocabulary.
    int head_rows = 0;
    // Layers whose input hidden states each decode records (a hidden-state drafter reads them:
    // Context::features). Empty: none.
    std::vector<int> tap_layers;
    // Record the target's final hidden state per position instead (llama.cpp's h_nextn, what
    // its MTP layers read: Context::features). Needs the extension functions
    // (nextn_extension_missing() is empty).
    bool nextn_features = false;
    std::string kv_type = "f16";  // the KV cache's element type: f16, q8_0, ... (ggml's names)
    // Numerics (docs/exact.md). flash_attn: -1 llama.cpp's choice, 0 off, 1 on. exact: every
    // row of a pass gets the same logits bits whatever the number of rows (exact_head.h; this
    // context's CPU backend runs ggml's reference kernels).
    int flash_attn = -1;
    bool exact = false;
    // Sequences sharing the context (batched serving), each with its own positions and up to
    // n_ctx of them, in one cache (llama.cpp's unified KV cache: a pass over rows of several
    // sequences is one graph). Numbered 0 .. n_seq-1. A tap or exact mode needs n_seq = 1.
    int n_seq = 1;
    // A recurrent or hybrid model: how many of its newest positions a rollback may drop. Its
    // graph then keeps that many snapshots of each sequence's state (llama.cpp's n_rs_seq, for
    // the architectures that support it; 0 elsewhere). Ignored for attention-only models.
    int rollback_depth = 0;
};

// Rows of one sequence in a multi-sequence pass (Context::decode_rows).
struct SeqRows {
    int seq = 0;
    std::vector<Token> tokens;
    // Empty, or where only[i] is not empty: row i's logits are read at those tokens alone
    // (logits(r) is then unset elsewhere when localspec's head computes them).
    std::vector<std::vector<Token>> only;
};

// One llama_context with n_seq sequences, plus the list of tokens its KV cache holds for each.
// Invariant: kv_tokens(s)[i] is the token stored at position i of sequence s, for every
// i < kv_tokens(s).size(). Every `seq` argument defaults to sequence 0.
class Context {
public:
    Context(const Model& model, const ContextOptions& options);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    int n_ctx() const;  // positions per sequence
    int n_seq() const { return static_cast<int>(kv_.size()); }
    // Whether one pass may hold rows of several sequences (decode_rows): one cache shared by
    // all of them. Exact mode instead gives each sequence a KV stream of its own, so no other
    // sequence's cells enter its attention (they change the low bits), and its passes hold
    // one sequence each.
    bool shares_passes() const { return shares_passes_; }
    int n_vocab() const { return n_vocab_; }
    const std::vector<Token>& kv_tokens(int seq = 0) const { return kv_.at(static_cast<size_t>(seq)); }

    // Append tokens to a sequence's cache. Logits are kept for the last `n_logits` of them,
    // readable with logits(0 .. n_logits-1) until the next decode. Splits long inputs into
    // n_batch pieces. `only`: as SeqRows::only, for the logits rows.
    void decode(const std::vector<Token>& tokens, int n_logits, int seq = 0,
                const std::vector<std::vector<Token>>& only = {});
    // One pass over rows of several sequences (at most n_batch rows in all; several only when
    // shares_passes()), logits on every row: logits(r) is row r counting through the pieces in
    // order.
    void decode_rows(const std::vector<SeqRows>& pieces);
    const float* logits(int row) const;
    // Which head computes the logits: "localspec-q8_0" or "localspec-q6_k"
    // (ContextOptions::fast_head took effect) or "llama.cpp".
    const char* batch_head() const;
    // Which head computed the last decode's logits (the same two names).
    const char* last_head() const;
    // Rows of the last decode whose logits were computed at their `only` tokens alone.
    int last_chosen_rows() const;

    // The most positions truncate() can drop from a sequence right after a pass over it: -1
    // for attention memory (any number). A recurrent state goes back only through the
    // snapshots the last pass kept (ContextOptions::rollback_depth, 0 if the architecture
    // keeps none), once per pass and no further back than that pass's first row.
    int rollback_depth() const { return rollback_depth_; }

    // Drop cache entries at positions >= n_keep (the KV rollback). Throws when the model's
    // memory cannot drop them (a recurrent state beyond its snapshots: rollback_depth) and
    // keeps the cache unchanged then; dropping everything (n_keep = 0) always works.
    void truncate(size_t n_keep, int seq = 0);
    // The same, returning false instead of throwing when the memory refuses.
    bool try_truncate(size_t n_keep, int seq = 0);
    // How many leading tokens of `tokens` the sequence's cache already holds.
    size_t common_prefix(const std::vector<Token>& tokens, int seq = 0) const;
    // Make the cache hold exactly `tokens` (minus what must be recomputed): reuse the common
    // prefix, drop the rest, decode the remainder (everything, when the memory cannot drop a
    // suffix and the cache holds more than the common prefix). Returns how many tokens were
    // decoded.
    size_t sync(const std::vector<Token>& tokens, int n_logits, int seq = 0);

    // The hidden states entering ContextOptions::tap_layers, recorded per cached position of
    // each sequence: row p (features_begin(seq) <= p < kv_tokens(seq).size()) is those layers'
    // inputs for the token at position p, concatenated (feature_width() floats). truncate()
    // drops rows with the cache entries; drop_features_before(p) frees rows a reader no longer
    // needs.
    int feature_width() const { return feature_width_; }
    size_t features_begin(int seq = 0) const { return features_.at(static_cast<size_t>(seq)).begin(); }
    const float* features(size_t pos, int seq = 0) const;
    void drop_features_before(size_t pos, int seq = 0);
    // Whether decodes record features (default on). Off, the graph runs uninterrupted and
    // positions decoded meanwhile have none (a reader gets a gap it must tolerate).
    void set_tapping(bool on);

private:
    friend class HeadContext;
    friend class MtpContext;
    friend std::vector<float> extracted_layer_inputs(const Model&, const std::vector<Token>&, const std::vector<int>&);
    // (sequence, rows) of a decode's batch, in batch order: whose positions its rows are.
    using BatchLayout = std::vector<std::pair<int, size_t>>;
    bool recording(const BatchLayout& layout);
    void record_features(const BatchLayout& layout);
    void record_nextn_features(const BatchLayout& layout);
    struct Impl;
    std::unique_ptr<Impl> impl_;
    void kept_snapshots(int seq, size_t n_rows);
    std::vector<std::vector<Token>> kv_;  // [seq]: the tokens its cache holds
    int rollback_depth_ = -1;
    std::vector<size_t> rollback_room_;  // [seq]: positions a rollback may drop now (recurrent)
    bool shares_passes_ = false;
    int n_vocab_ = 0;
    int n_logits_ = 0;
    int feature_width_ = 0;
    std::vector<FeatureLog> features_;  // [seq]
};

// The llama_context of an EAGLE-3 head (a GGUF of architecture "eagle3"), next to its target's
// context (whose token embeddings it borrows). Its memory holds one entry per target position
// P: the pair (token at P + 1, g_P), where g_P = fc(the target's features at P). The graph stops
// after the final norm: localspec computes the draft logits itself (eagle3_head.h), over the
// head's own vocabulary, instead of llama.cpp's head scattered into the target's vocabulary.
class HeadContext {
public:
    // f32_cache: an F32 KV cache and no flash attention (whose CPU kernel rounds to F16), so
    // that the head's states match a float32 reference (the training code's parity test).
    HeadContext(const Model& head, const Context& target, int n_threads, bool f32_cache = false);
    ~HeadContext();
    HeadContext(const HeadContext&) = delete;
    HeadContext& operator=(const HeadContext&) = delete;

    int n_embd() const { return n_embd_; }
    int n_positions() const { return n_positions_; }  // entries 0 .. n_positions()-1 are held
    // g rows (n_embd() each) for `n_rows` rows of target features.
    void encode(const float* features, int n_rows, int width, std::vector<float>& g);
    // Append the pairs (tokens[i], g row i) at positions n_positions() + i. Afterwards
    // prenorm(i) is row i's state before the final norm (the next draft step's g) and
    // normed(i) its normalised state (the input of the draft logits).
    void decode(const Token* tokens, const float* g, int n_rows);
    const float* prenorm(int row) const;
    const float* normed(int row) const;
    int n_rows() const { return n_rows_; }  // rows of the last decode
    void truncate(int n_keep);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int n_embd_ = 0;
    int n_rows_ = 0;
    int n_positions_ = 0;
};

// The llama_context that runs a target's MTP (NextN) layers (llama.cpp's MTP context type, on
// the target's own model, loaded with ModelOptions::load_mtp). Its memory holds one entry per
// target position q: the pair (token q, h_{q-1}), h_{q-1} being the target's final hidden state
// at q - 1 (Context::features with nextn_features; zeros for q = 0, as llama.cpp pairs it). The
// entry's output is the distribution of token q + 1 and a hidden state that stands in for the
// target's h_q when the next entry is a draft token. A model with several NextN layers keeps
// every layer's keys and values in the one cache: an entry is written layer by layer (the same
// positions decoded again after truncating them: the cache refills the same cells in order, as
// llama.cpp's own chained MTP drafter relies on).
class MtpContext {
public:
    MtpContext(const Model& target_model, const Context& target, int n_threads);
    ~MtpContext();
    MtpContext(const MtpContext&) = delete;
    MtpContext& operator=(const MtpContext&) = delete;

    int n_embd() const { return n_embd_; }
    int n_vocab() const { return n_vocab_; }
    int n_positions() const { return n_positions_; }  // entries 0 .. n_positions()-1 are held
    int n_layers() const { return n_layers_; }  // NextN layers (llama_model_n_layer_nextn)
    // Append the pairs (tokens[i], h row i) at positions n_positions() + i, through NextN layer
    // `layer` (0 .. n_layers()-1); afterwards logits() and state() belong to the last of them.
    void decode(const Token* tokens, const float* h, int n_rows, int layer = 0);
    const float* logits() const;
    const float* state() const;
    void truncate(int n_keep);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int n_embd_ = 0;
    int n_vocab_ = 0;
    int n_layers_ = 0;
    int n_positions_ = 0;
};

// Why this libllama cannot run MTP layers (it lacks llama.cpp's C++-only extension functions
// llama_set_embeddings_nextn / llama_get_embeddings_nextn_ith / llama_set_nextn_layer_offset);
// "" when it can.
std::string nextn_extension_missing();

// The same rows as Context::features, from llama.cpp's own layer-input extraction (only some
// architectures publish it; llama does): the cross-check of the graph tap. Throws UserError when
// the loaded libllama lacks the extension functions.
std::vector<float> extracted_layer_inputs(const Model& model, const std::vector<Token>& tokens,
                                          const std::vector<int>& layers);
// Context::features of a fresh context over `tokens`.
std::vector<float> tapped_layer_inputs(const Model& model, const std::vector<Token>& tokens,
                                       const std::vector<int>& layers);

// A GBNF grammar in some state (llama.cpp's grammar sampler): which tokens may come next, and
// accepting them one by one. Not thread-safe; copy with clone() to explore without changing it.
class Grammar {
public:
    // Throws UserError(InvalidParameter) when `gbnf` does not parse (root rule: "root").
    Grammar(const Model& model, const std::string& gbnf);
    ~Grammar();
    Grammar(const Grammar&) = delete;
    Grammar& operator=(const Grammar&) = delete;

    std::unique_ptr<Grammar> clone() const;
    // Whether `token` may come next (one token checked: cheap).
    bool allows(Token token) const;
    // Which of `candidates` may come next, in their order (one pass over the list).
    std::vector<Token> allowed(const std::vector<Token>& candidates) const;
    // Set the logit of every token that may not come next to -infinity (the whole vocabulary
    // checked: this is the expensive call).
    void mask(float* logits, int n_vocab);
    // Advance past `token`, which must be allowed.
    void accept(Token token);
    // Seconds of one mask() over the whole vocabulary in the grammar's first state: what every
    // row of a step can cost when the model's best tokens are not allowed. Throws like mask()
    // when the grammar allows no token there.
    double first_mask_seconds(int n_vocab);

private:
    Grammar() = default;
    void apply(llama_token_data_array& array) const;  // llama.cpp's errors as UserError
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// A compute device as ggml's backend registry reports it (the memory planner's input).
struct DeviceInfo {
    std::string name, description;
    std::string kind;  // "cpu", "gpu", "igpu" or "accel"
    uint64_t free_bytes = 0, total_bytes = 0;
};
std::vector<DeviceInfo> list_devices();

// Quantize a GGUF (llama.cpp's quantize API). type: "Q4_K_M", "Q8_0", "F16", ...
void quantize_model(const std::string& in_path, const std::string& out_path,
                    const std::string& type, int n_threads);

}  // namespace localspec
