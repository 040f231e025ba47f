// Context: one llama_context with its sequences' KV bookkeeping (decode, rollback, sync), the
// output head hook, exact mode's kernels and padding, and the recorded hidden states.
#include "llama/llama_backend.h"

#include <llama.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "kernels/head_common.h"
#include "kernels/head_hook.h"
#include "llama/graph_tap.h"
#include "llama/impl.h"
#include "rpc/rpc.h"

namespace localspec {

namespace {

bool on_target_node(ggml_tensor* t, bool ask, void* user_data) {
    auto& hooks = *static_cast<TargetHooks*>(user_data);
    if (ask) {
        const bool tap = hooks.tapping && hooks.tap.wants(t);
        const bool head = hooks.fast_head && HeadHook::on_graph_node(t, true, &hooks.hook);
        return tap || head;
    }
    if (hooks.tapping && hooks.tap.wants(t)) {
        hooks.tap.capture(t);
        return true;
    }
    return HeadHook::on_graph_node(t, false, &hooks.hook);
}

GraphTap layer_tap(const Model& model, const std::vector<int>& layers) {
    std::vector<std::string> names;
    for (int il : layers) {
        if (il < 1 || il >= model.n_layer()) {
            throw UserError(ErrorKind::InvalidParameter,
                            "the drafter reads the input of layer " + std::to_string(il) + ", but '" +
                                model.path() + "' has layers 0.." + std::to_string(model.n_layer() - 1) +
                                " and localspec reads layers 1.." + std::to_string(model.n_layer() - 1) +
                                "; use a head made for this target.");
        }
        names.push_back(layer_input_name(il));
    }
    return GraphTap(names);
}

// Exact mode asks ggml's CPU backend of its own context for the reference kernels
// (ggml_backend_cpu_set_use_ref): no tiled K-quant matmul (from 8 rows it sums in another order
// than the one-row dot product) and no tiled or cache-split flash attention (every query row then
// runs the same loop over the whole cache, so an F16 cache is batch-invariant too). The switch
// belongs to that context's backend only; llama.cpp keeps its backends in the context's
// scheduler, which only its C++ member llama_context::get_sched() returns.
void use_reference_kernels(llama_context* ctx) {
    // ggml_backend_sched_t llama_context::get_sched() const (a member: `this` is the first argument)
    using GetSched = ggml_backend_sched_t (*)(const llama_context*);
    const auto get_sched = reinterpret_cast<GetSched>(libllama_symbol("_ZNK13llama_context9get_schedEv"));
    if (!get_sched) {
        throw UserError(ErrorKind::InvalidParameter,
                        "this libllama does not export llama_context::get_sched (llama-cpp-python 0.3.36 "
                        "does), so exact mode cannot choose its kernels; install that version or leave out --exact.");
    }
    ggml_backend_sched_t sched = get_sched(ctx);
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
        ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
        ggml_backend_dev_t device = ggml_backend_get_device(backend);
        if (device == nullptr || ggml_backend_dev_type(device) != GGML_BACKEND_DEVICE_TYPE_CPU) continue;
        using SetUseRef = void (*)(ggml_backend_t, bool);
        const auto set_use_ref = reinterpret_cast<SetUseRef>(
            ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(device), "ggml_backend_cpu_set_use_ref"));
        if (!set_use_ref) {
            throw UserError(ErrorKind::InvalidParameter,
                            "this ggml CPU backend has no ggml_backend_cpu_set_use_ref, so exact mode cannot "
                            "choose its kernels; install llama-cpp-python 0.3.36 or leave out --exact.");
        }
        set_use_ref(backend, true);
    }
}

// Whether the model's matrices are mostly F32, F16 or BF16 (general.file_type 0, 1 or 32): the
// types whose llamafile sgemm sums in another order than the one-row dot product.
bool has_sgemm_matrices(const Model& model) {
    const std::string file_type = model.metadata("general.file_type");
    return file_type == "0" || file_type == "1" || file_type == "32";
}

void run_decode(llama_context* ctx, llama_batch& batch, const std::vector<std::string>& rpc) {
    check_rpc_alive(rpc);  // a worker that hung up: an error here, not an abort inside ggml
    const int32_t rc = llama_decode(ctx, batch);
    if (rc != 0) {
        throw std::runtime_error("llama_decode failed with code " + std::to_string(rc) + ": " + take_last_error());
    }
}

struct Padding {
    int front = 0, back = 0;  // output rows added before / after the asked-for ones
    bool extra_token = false;  // a second row was added (its cache entry goes afterwards)
};

// Exact mode on a model with F16/BF16/F32 matrices: llama.cpp multiplies those by llamafile's
// sgemm from 2 rows on and by a one-row dot product otherwise, which sum in different orders.
// So no graph may hold a single row (a second one is added, the same token one position on,
// and removed from the cache afterwards), and no graph a single output row (the last layer
// after attention runs on output rows only: the row before the output row asks for logits too).
Padding pad_batch(llama_batch& batch) {
    Padding pad;
    const int n = batch.n_tokens;
    int outputs = 0;
    for (int j = 0; j < n; ++j) outputs += batch.logits[j] ? 1 : 0;
    if (n == 1) {
        batch.token[1] = batch.token[0];
        batch.pos[1] = batch.pos[0] + 1;
        batch.n_seq_id[1] = 1;
        batch.seq_id[1][0] = batch.seq_id[0][0];
        batch.logits[1] = batch.logits[0];
        batch.n_tokens = 2;
        pad.back = outputs;
        pad.extra_token = true;
    } else if (outputs == 1 && batch.logits[n - 1] && !batch.logits[n - 2]) {
        batch.logits[n - 2] = 1;
        pad.front = 1;
    }
    return pad;
}

ggml_type kv_cache_type(const std::string& name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const auto type = static_cast<ggml_type>(t);
        const char* type_name = ggml_type_name(type);
        if (type_name != nullptr && name == type_name) return type;
    }
    throw UserError(ErrorKind::InvalidParameter, "kv_type '" + name + "' is not a ggml type; use f16 or q8_0.");
}

}  // namespace

Context::Context(const Model& model, const ContextOptions& options) : impl_(std::make_unique<Impl>()) {
    llama_context_params params = llama_context_default_params();
    params.type_k = kv_cache_type(options.kv_type);
    params.type_v = params.type_k;
    params.flash_attn_type = options.flash_attn < 0    ? LLAMA_FLASH_ATTN_TYPE_AUTO
                             : options.flash_attn == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                       : LLAMA_FLASH_ATTN_TYPE_ENABLED;
    int threads = options.n_threads > 0 ? options.n_threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int n_seq = std::max(1, options.n_seq);
    params.n_ctx = static_cast<uint32_t>(options.n_ctx * n_seq);
    params.n_batch = static_cast<uint32_t>(std::min(options.n_batch, options.n_ctx));
    params.n_ubatch = std::min<uint32_t>(params.n_batch, 512);
    params.n_seq_max = static_cast<uint32_t>(n_seq);
    // Rows of several sequences in one graph (split_simple) need one cache for all of them;
    // exact mode gives each sequence a stream of its own (shares_passes()).
    params.kv_unified = !options.exact || n_seq == 1;
    // A GPU build computes a CPU-held layer's large batches (a prompt) on the GPU: exact mode
    // keeps every row on the CPU's reference kernels, or a prompt's rows get other bits there.
    params.op_offload = !options.exact;
    shares_passes_ = n_seq > 1 && params.kv_unified;
    params.n_threads = threads;
    params.n_threads_batch = threads;
    params.no_perf = true;
    // Speculation rolls the cache back by up to k positions. A sliding-window cache of
    // window size only (Gemma 3, Mistral) evicts old positions as new ones arrive, and after a
    // rollback those would be missing from the window: keep the full-size cache instead.
    params.swa_full = true;
    const bool recurrent = !model.can_drop_suffix();
    params.n_rs_seq = recurrent ? static_cast<uint32_t>(std::max(0, options.rollback_depth)) : 0;
    // Exact mode always computes the head (exact_head.h); the batched heads need AVX2 at least.
    impl_->fast_head = options.exact || (options.fast_head && !head_kernel_names().empty());
    impl_->hooks.fast_head = impl_->fast_head;
    impl_->hook.set_exact(options.exact);
    impl_->hook.set_row_limit(options.head_rows);
    impl_->exact = options.exact;
    impl_->pad_rows = options.exact && has_sgemm_matrices(model);
    const bool hidden_states = !options.tap_layers.empty() || options.nextn_features;
    if (impl_->pad_rows && hidden_states) {
        throw UserError(ErrorKind::InvalidParameter,
                        "exact mode cannot yet feed a hidden-state drafter from an F16/BF16/F32 target (its "
                        "single rows are padded); use a quantized target or leave out --exact.");
    }
    kv_.assign(static_cast<size_t>(n_seq), {});
    features_.assign(static_cast<size_t>(n_seq), {});
    impl_->hooks.tap = layer_tap(model, options.tap_layers);
    if (impl_->fast_head || !impl_->hooks.tap.empty()) {
        params.cb_eval = on_target_node;
        params.cb_eval_user_data = &impl_->hooks;
    }
    impl_->n_threads = threads;
    impl_->rpc = model.impl_->rpc;
    check_rpc_alive(impl_->rpc);
    take_last_error();
    impl_->ctx = llama_init_from_model(model.impl_->model, params);
    if (!impl_->ctx) {
        std::string reason = take_last_error();
        throw UserError(ErrorKind::ModelLoad, "could not create a context of " +
                                                  std::to_string(options.n_ctx) + " tokens for '" +
                                                  model.path() + "': " + reason +
                                                  " (try a smaller --ctx)");
    }
    if (options.exact) use_reference_kernels(impl_->ctx);
    if (options.nextn_features) {
        impl_->nextn = require_nextn_ext();
        impl_->nextn.set(impl_->ctx, true, false);  // every row's hidden state, not only the outputs'
        feature_width_ = llama_model_n_embd_out(model.impl_->model);
    }
    impl_->n_batch = static_cast<int>(params.n_batch);
    impl_->n_ubatch = static_cast<int>(params.n_ubatch);
    impl_->batch = llama_batch_init(impl_->n_batch, 0, 1);
    // llama.cpp keeps no snapshots for the architectures that do not support them (n_rs_seq 0).
    if (recurrent) rollback_depth_ = static_cast<int>(llama_n_rs_seq(impl_->ctx));
    rollback_room_.assign(static_cast<size_t>(n_seq), 0);
    n_vocab_ = llama_vocab_n_tokens(model.impl_->vocab);
    if (impl_->fast_head || !impl_->hooks.tap.empty()) {
        // One token through the graph shows the hook the head (built at load) and proves that
        // the graph names the tapped layers.
        const Token bos = llama_vocab_bos(model.impl_->vocab);
        decode({bos >= 0 ? bos : 0}, 1);
        truncate(0);
    }
}

Context::~Context() = default;

int Context::n_ctx() const { return static_cast<int>(llama_n_ctx(impl_->ctx)) / n_seq(); }

void Context::decode(const std::vector<Token>& tokens, int n_logits, int seq,
                     const std::vector<std::vector<Token>>& only) {
    std::vector<Token>& kv = kv_.at(static_cast<size_t>(seq));
    const size_t n = tokens.size();
    // Exact mode decodes one llama.cpp graph (n_ubatch rows) per call, so that no graph of a
    // long input is left with the single row that would take other kernels (pad_batch).
    const size_t n_batch = static_cast<size_t>(impl_->exact ? impl_->n_ubatch : impl_->n_batch);
    if (n_logits > static_cast<int>(n_batch)) throw std::logic_error("more logits rows than n_batch");
    const size_t first_logit = n - std::min(n, static_cast<size_t>(std::max(n_logits, 0)));
    // The first piece takes the remainder so that the last piece is full and holds every row
    // that asks for logits (llama.cpp keeps only the last decode call's outputs).
    size_t end = 0;
    for (size_t start = 0; start < n; start = end) {
        end = start == 0 && n % n_batch != 0 ? n % n_batch : start + n_batch;
        llama_batch& batch = impl_->batch;
        batch.n_tokens = static_cast<int32_t>(end - start);
        for (size_t i = start; i < end; ++i) {
            const size_t j = i - start;
            batch.token[j] = tokens[i];
            batch.pos[j] = static_cast<llama_pos>(kv.size() + j);
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = seq;
            batch.logits[j] = i >= first_logit ? 1 : 0;
        }
        // The hook takes the rows of one graph: llama.cpp runs a graph per n_ubatch tokens, so
        // a piece longer than that (rows with logits could fall in two graphs) keeps llama.cpp's
        // head.
        const bool last = end == n;
        const Padding pad = impl_->pad_rows ? pad_batch(batch) : Padding{};
        const bool one_graph = batch.n_tokens <= impl_->n_ubatch;
        if (impl_->fast_head) impl_->hook.before_decode(last && one_graph && n > first_logit);
        run_decode(impl_->ctx, batch, impl_->rpc);
        if (pad.extra_token) llama_memory_seq_rm(llama_get_memory(impl_->ctx), seq, batch.pos[batch.n_tokens - 1], -1);
        if (last) impl_->padding = {pad.front, pad.back};
        kv.insert(kv.end(), tokens.begin() + static_cast<long>(start), tokens.begin() + static_cast<long>(end));
        kept_snapshots(seq, end - start);
        record_features({{seq, end - start}});
        record_nextn_features({{seq, end - start}});
    }
    n_logits_ = static_cast<int>(n - first_logit);
    const int captured = n_logits_ + impl_->padding.front + impl_->padding.back;
    std::vector<std::vector<Token>> hook_only;
    if (!only.empty()) {
        hook_only.resize(static_cast<size_t>(captured));
        for (size_t i = 0; i < only.size() && i < static_cast<size_t>(n_logits_); ++i) {
            hook_only[i + static_cast<size_t>(impl_->padding.front)] = only[i];
        }
    }
    impl_->used_head = impl_->fast_head && impl_->hook.after_decode(captured, n_vocab_, impl_->n_threads, hook_only);
}

void Context::decode_rows(const std::vector<SeqRows>& pieces) {
    if (pieces.size() == 1) {  // one sequence: decode() (exact mode's padding lives there)
        decode(pieces[0].tokens, static_cast<int>(pieces[0].tokens.size()), pieces[0].seq, pieces[0].only);
        return;
    }
    if (!shares_passes_) throw std::logic_error("this context's passes hold one sequence each");
    int total = 0;
    for (const SeqRows& piece : pieces) total += static_cast<int>(piece.tokens.size());
    if (total > impl_->n_batch) throw std::logic_error("more rows than n_batch in one pass");
    llama_batch& batch = impl_->batch;
    batch.n_tokens = total;
    int j = 0;
    for (const SeqRows& piece : pieces) {
        const size_t n_cached = kv_.at(static_cast<size_t>(piece.seq)).size();
        for (size_t i = 0; i < piece.tokens.size(); ++i, ++j) {
            batch.token[j] = piece.tokens[i];
            batch.pos[j] = static_cast<llama_pos>(n_cached + i);
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = piece.seq;
            batch.logits[j] = 1;
        }
    }
    if (impl_->fast_head) impl_->hook.before_decode(total <= impl_->n_ubatch);
    run_decode(impl_->ctx, batch, impl_->rpc);
    BatchLayout layout;
    for (const SeqRows& piece : pieces) {
        std::vector<Token>& kv = kv_.at(static_cast<size_t>(piece.seq));
        kv.insert(kv.end(), piece.tokens.begin(), piece.tokens.end());
        kept_snapshots(piece.seq, piece.tokens.size());
        layout.emplace_back(piece.seq, piece.tokens.size());
    }
    record_features(layout);
    record_nextn_features(layout);
    impl_->padding = {0, 0};
    n_logits_ = total;
    std::vector<std::vector<Token>> hook_only;  // the pieces' `only` in pass order, if any has one
    const bool any_only = std::any_of(pieces.begin(), pieces.end(), [](const SeqRows& p) { return !p.only.empty(); });
    for (const SeqRows& piece : pieces) {
        for (size_t i = 0; any_only && i < piece.tokens.size(); ++i) {
            hook_only.push_back(i < piece.only.size() ? piece.only[i] : std::vector<Token>{});
        }
    }
    impl_->used_head = impl_->fast_head && impl_->hook.after_decode(total, n_vocab_, impl_->n_threads, hook_only);
}

const char* Context::batch_head() const { return impl_->hook.name(); }

const char* Context::last_head() const { return impl_->used_head ? impl_->hook.name() : "llama.cpp"; }

int Context::last_chosen_rows() const { return impl_->used_head ? impl_->hook.chosen_rows() : 0; }

const float* Context::logits(int row) const {
    // Rows with logits are the last n_logits_ tokens of the last decode call; llama.cpp
    // indexes them by batch position, so count from the end of that (last) batch.
    if (row < 0 || row >= n_logits_) throw std::out_of_range("logits row out of range");
    if (impl_->used_head) return impl_->hook.logits(row + impl_->padding.front, n_vocab_);
    const float* out = llama_get_logits_ith(impl_->ctx, row - n_logits_ - impl_->padding.back);
    if (!out) throw std::runtime_error("llama.cpp returned no logits for row " + std::to_string(row));
    return out;
}

// A pass of n rows over a recurrent sequence leaves snapshots of its state 0 .. n-1 rows back
// (at most rollback_depth_): a rollback may drop up to n - 1 positions, and only until the
// next pass (llama.cpp marks the snapshot to start from, once).
void Context::kept_snapshots(int seq, size_t n_rows) {
    if (rollback_depth_ < 0) return;
    rollback_room_.at(static_cast<size_t>(seq)) = std::min(static_cast<size_t>(rollback_depth_), n_rows - 1);
}

bool Context::try_truncate(size_t n_keep, int seq) {
    std::vector<Token>& kv = kv_.at(static_cast<size_t>(seq));
    if (n_keep >= kv.size()) return true;
    // A recurrent state loses its last positions only through a snapshot. llama.cpp checks
    // the depth but not which pass wrote the snapshot, so the room is checked here. Removing
    // everything (from 0) always succeeds.
    const bool recurrent = rollback_depth_ >= 0;
    if (recurrent && n_keep > 0 && kv.size() - n_keep > rollback_room_.at(static_cast<size_t>(seq))) return false;
    if (!llama_memory_seq_rm(llama_get_memory(impl_->ctx), seq, static_cast<llama_pos>(n_keep), -1)) return false;
    if (recurrent) rollback_room_.at(static_cast<size_t>(seq)) = 0;
    kv.resize(n_keep);
    features_.at(static_cast<size_t>(seq)).truncate(n_keep, static_cast<size_t>(feature_width_));
    n_logits_ = 0;
    impl_->used_head = false;
    return true;
}

void Context::truncate(size_t n_keep, int seq) {
    if (try_truncate(n_keep, seq)) return;
    throw std::runtime_error("this model's memory cannot drop cached positions " + std::to_string(n_keep) + ".." +
                             std::to_string(kv_tokens(seq).size() - 1) +
                             " (a recurrent or hybrid model keeps one running state, and snapshots of it for "
                             "at most " + std::to_string(std::max(0, rollback_depth_)) +
                             " positions of its last pass), so it cannot take back these draft tokens; decode it "
                             "with the drafter 'none'.");
}

// Whether a decode's features are recorded (set_tapping). When not, the logs of its sequences
// restart after it: a log keeps only a contiguous run of recorded positions.
bool Context::recording(const BatchLayout& layout) {
    if (impl_->hooks.tapping) return true;
    for (const auto& [seq, n] : layout) features_.at(static_cast<size_t>(seq)).restart(kv_tokens(seq).size());
    return false;
}

// After a decode: the tap holds each tapped layer's rows for the batch's positions (in batch
// order: `layout`); interleave them into one row per position of its sequence.
void Context::record_features(const BatchLayout& layout) {
    GraphTap& tap = impl_->hooks.tap;
    if (tap.empty() || !recording(layout)) return;
    size_t total = 0;
    for (const auto& piece : layout) total += piece.second;
    std::vector<size_t> widths;
    for (size_t i = 0; i < tap.size(); ++i) {
        if (static_cast<size_t>(tap.n_rows(i)) != total) {
            throw UserError(ErrorKind::InvalidParameter,
                            "this target's graph does not show the hidden states a hidden-state drafter "
                            "reads (node 'l_out-N' missing); use another drafter for this model.");
        }
        widths.push_back(static_cast<size_t>(tap.width(i)));
    }
    size_t width = 0;
    for (size_t w : widths) width += w;
    feature_width_ = static_cast<int>(width);
    size_t r = 0;
    for (const auto& [seq, n] : layout) {
        FeatureLog& log = features_.at(static_cast<size_t>(seq));
        for (size_t k = 0; k < n; ++k, ++r) {
            for (size_t i = 0; i < tap.size(); ++i) log.append(tap.rows(i).data() + r * widths[i], 1, widths[i]);
        }
    }
    tap.clear();
}

// After a decode: llama.cpp's h_nextn rows, one per token of the batch, dense, in batch order.
void Context::record_nextn_features(const BatchLayout& layout) {
    if (!impl_->nextn.ok() || !recording(layout)) return;
    const float* rows = impl_->nextn.get(impl_->ctx);
    if (!rows) throw std::runtime_error("llama.cpp returned no final hidden states (h_nextn) for this decode");
    const auto width = static_cast<size_t>(feature_width_);
    for (const auto& [seq, n] : layout) {
        features_.at(static_cast<size_t>(seq)).append(rows, n, width);
        rows += n * width;
    }
}

void Context::set_tapping(bool on) {
    impl_->hooks.tapping = on;
    // Off, the target's last layer runs on the output rows only again.
    if (impl_->nextn.ok()) impl_->nextn.set(impl_->ctx, on, false);
}

const float* Context::features(size_t pos, int seq) const {
    const FeatureLog& log = features_.at(static_cast<size_t>(seq));
    const auto width = static_cast<size_t>(feature_width_);
    if (width == 0 || pos < log.begin() || pos >= log.end(width)) {
        throw std::out_of_range("no recorded features for position " + std::to_string(pos));
    }
    return log.row(pos, width);
}

void Context::drop_features_before(size_t pos, int seq) {
    features_.at(static_cast<size_t>(seq)).drop_before(pos, static_cast<size_t>(feature_width_));
}

size_t Context::common_prefix(const std::vector<Token>& tokens, int seq) const {
    const std::vector<Token>& kv = kv_tokens(seq);
    size_t common = 0;
    const size_t limit = std::min(tokens.size(), kv.size());
    while (common < limit && tokens[common] == kv[common]) ++common;
    return common;
}

size_t Context::sync(const std::vector<Token>& tokens, int n_logits, int seq) {
    // Rows that need logits must be recomputed even when cached.
    size_t common = std::min(common_prefix(tokens, seq),
                             tokens.size() - std::min(tokens.size(), static_cast<size_t>(n_logits)));
    if (!try_truncate(common, seq)) {
        common = 0;  // a recurrent state: start over
        truncate(0, seq);
    }
    if (common == tokens.size()) return 0;
    std::vector<Token> rest(tokens.begin() + static_cast<long>(common), tokens.end());
    decode(rest, n_logits, seq);
    return rest.size();
}

}  // namespace localspec
