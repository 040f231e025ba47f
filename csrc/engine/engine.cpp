#include "engine/engine.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "kernels/body_matmul.h"
#include "draft/combinators.h"
#include "draft/eagle3_drafter.h"
#include "base/errors.h"
#include "draft/forced_drafter.h"
#include "draft/model_drafter.h"
#include "draft/mtp_drafter.h"
#include "draft/ngram_drafter.h"
#include "draft/prediction_drafter.h"
#include "engine/sequence.h"
#include "draft/vocab_check.h"

namespace localspec {

// The drafter spelling: "none", "ngram", "hybrid:PATH" (n-gram when it matches, else the draft
// at PATH), "eagle3:PATH" (n-gram when it matches, else the EAGLE-3 head at PATH), "mtp"
// (n-gram when it matches, else the target's own MTP layers) or PATH (the draft model or
// EAGLE-3 head at PATH alone, as a bare draft model drafts alone). Whether PATH is a head is
// read from its header, once.
struct DrafterSpec {
    std::string kind;  // "none", "ngram", "model", "eagle3" or "mtp"
    std::string path;
    bool with_ngram = false;
    std::optional<Eagle3Info> head;  // for kind "eagle3"
};

namespace {

// Exact mode's attention: flash attention, whose reference kernel (Context asks for it) runs
// every query row through the same loop over the whole cache, of any cache type. Without it,
// Q·K goes through the F16 matmul, which sums 1 row and 2+ rows in different orders.
constexpr int kExactFlashAttn = 1;

// Default mode's claim: faster_body_types() unless the weights keep their file layout
// (--no-repack) or --llama-body.
int faster_body(const EngineOptions& options) {
    return options.fast_body && options.repack ? BodyKernelClaim::Faster : 0;
}

std::shared_ptr<Model> load_target(const EngineOptions& options) {
    backend_init(options.verbose);
    ModelOptions model{options.target_path, options.n_gpu_layers_target};
    model.repack = options.repack && !options.exact;
    // Which matrices localspec's kernels take (body_matmul.h): every quantized one in exact mode,
    // faster_body_types() in default mode; none over RPC, where a worker computes its layers itself.
    model.body_kernels = !options.rpc.empty() ? 0 : options.exact ? BodyKernelClaim::All : faster_body(options);
    model.load_mtp = options.drafter_kind == "mtp";
    model.rpc = options.rpc;
    return std::make_shared<Model>(model);
}

ContextOptions context_options(const EngineOptions& options, bool fast_head) {
    ContextOptions out;
    out.n_ctx = options.n_ctx;
    out.n_threads = options.n_threads;
    out.fast_head = fast_head;
    out.kv_type = options.kv_type;
    return out;
}

// The target's context: the numerics knobs, or exact mode's choice of them (docs/exact.md); with
// an EAGLE-3 head it records the hidden states the head reads.
ContextOptions target_options(const EngineOptions& options, const DrafterSpec& spec, const Model& target) {
    ContextOptions out = context_options(options, options.fast_head || options.exact);
    out.flash_attn = options.exact ? kExactFlashAttn : options.flash_attn;
    out.exact = options.exact;
    out.n_seq = options.n_seq;
    // A recurrent or hybrid target takes back at most this many rejected draft tokens (the
    // step caps its drafts at Context::rollback_depth); exact mode keeps it plain.
    out.rollback_depth = spec.kind == "none" || options.exact ? 0 : kRollbackDepth;
    if (spec.head) {
        check_head_fits(spec.path, *spec.head, target);
        out.tap_layers = spec.head->target_layers;
    }
    out.nextn_features = spec.kind == "mtp";
    return out;
}

std::unique_ptr<Drafter> configured_drafter(const EngineOptions& options, const DrafterSpec& spec,
                                            const Model& target, Context& target_ctx,
                                            const std::shared_ptr<const RecentOutputs>& recent) {
    const NgramDrafter ngram(options.ngram_min, options.ngram_max, recent);
    if (spec.kind == "ngram") return std::make_unique<NgramDrafter>(ngram);
    // Hidden-state drafters follow one generation each: one per slot (PerSlotDrafter).
    if (spec.kind == "mtp") {
        // (The factory runs later, when a slot first drafts: it holds copies, and references to
        // the engine's own target model and context only.)
        auto mtp = std::make_unique<PerSlotDrafter>(options.n_seq, [=, &target, &target_ctx](int slot) {
            return std::make_unique<MtpDrafter>(target, target_ctx, options.n_threads, options.draft_sampling,
                                                options.draft_p_min, slot);
        });
        return std::make_unique<HybridDrafter>(ngram, std::move(mtp), "mtp");
    }
    ModelOptions draft_options{spec.path, options.n_gpu_layers_draft};
    // A draft model's matrices go to default mode's faster kernels, in exact mode too: its tokens
    // are proposals the target checks, so its bits need not be batch-invariant. (Qwen2.5's 0.5B
    // is mostly Q5_0: its 896-wide rows do not fit K-quant blocks.) EAGLE-3 heads keep
    // llama.cpp's kernels: their one layer was never measured with localspec's.
    draft_options.body_kernels = spec.kind == "eagle3" ? 0 : faster_body(options);
    auto draft = std::make_shared<Model>(draft_options);
    check_vocab_compatible(target, *draft);
    std::unique_ptr<Drafter> model;
    if (spec.kind == "eagle3") {
        std::shared_ptr<const DraftVocabHead> vocab;  // the head's output layer, shared by the slots
        model = std::make_unique<PerSlotDrafter>(options.n_seq, [=, &target_ctx](int slot) mutable {
            auto head = std::make_unique<Eagle3Drafter>(draft, target_ctx, options.n_threads,
                                                        options.draft_sampling, options.draft_p_min, slot, vocab);
            vocab = head->vocab();
            return head;
        });
    } else {
        ContextOptions draft_ctx = context_options(options, options.fast_head);
        draft_ctx.n_seq = options.n_seq;  // a cache per generation slot (Drafter::select)
        draft_ctx.head_rows = options.draft_vocab;
        model = std::make_unique<ModelDrafter>(draft, draft_ctx, target.vocab().n_tokens, options.draft_sampling,
                                               options.draft_p_min);
    }
    if (!spec.with_ngram) return model;
    const std::string name = spec.kind == "eagle3" ? model->name() : "hybrid:" + model->name();
    return std::make_unique<HybridDrafter>(ngram, std::move(model), name);
}

// Every drafter drafts grammar-forced text first when a request has a grammar (forced_drafter.h).
std::unique_ptr<Drafter> make_drafter(const EngineOptions& options, const DrafterSpec& spec, const Model& target,
                                      Context& target_ctx, const std::shared_ptr<const RecentOutputs>& recent) {
    if (spec.kind == "none") return nullptr;
    auto configured = configured_drafter(options, spec, target, target_ctx, recent);
    auto predicted = std::make_unique<PredictionDrafter>(std::move(configured));
    return std::make_unique<ForcedDrafter>(target, std::move(predicted));
}

// The drafter EngineOptions names, checked (the kinds and what each needs are the Python layer's
// decision; this only refuses what cannot run).
DrafterSpec parse_drafter(const EngineOptions& options) {
    const std::string& kind = options.drafter_kind;
    const std::string& path = options.drafter_path;
    if (kind == "none" || kind == "ngram") return {kind, "", false, std::nullopt};
    if (kind == "mtp") {
        const std::string why = mtp_unsupported(options.target_path);
        if (!why.empty()) throw UserError(ErrorKind::InvalidParameter, why);
        return {kind, "", true, std::nullopt};
    }
    if (kind != "model" && kind != "hybrid" && kind != "head" && kind != "eagle3") {
        throw UserError(ErrorKind::InvalidParameter, "unknown drafter kind '" + kind.substr(0, 40) + "'.");
    }
    if (path.empty()) throw UserError(ErrorKind::InvalidParameter, "a " + kind + " drafter needs a model path.");
    const bool with_ngram = kind == "hybrid" || kind == "eagle3";
    std::optional<Eagle3Info> head = read_eagle3_info(path);
    const bool wants_head = kind == "head" || kind == "eagle3";
    if (wants_head != head.has_value()) {
        throw UserError(ErrorKind::InvalidParameter,
                        "'" + path + "' is " + (head ? "an EAGLE-3 head, not a draft model" : "not an EAGLE-3 head") + ".");
    }
    return {head ? "eagle3" : "model", path, with_ngram, std::move(head)};
}

}  // namespace

SpecEngine::SpecEngine(const EngineOptions& options)
    : SpecEngine(options, parse_drafter(options)) {}

SpecEngine::SpecEngine(const EngineOptions& options, const DrafterSpec& drafter)
    : exact_(options.exact),
      target_model_(load_target(options)),
      target_(*target_model_, target_options(options, drafter, *target_model_)),
      recent_(options.recent_ngram_tokens > 0
                  ? std::make_shared<RecentOutputs>(static_cast<size_t>(options.recent_ngram_tokens))
                  : nullptr),
      drafter_(make_drafter(options, drafter, *target_model_, target_, recent_)),
      controller_(drafter_ ? options.controller_k_max : 0) {}

SpecEngine::~SpecEngine() = default;

void SpecEngine::check_request(const GenerateRequest& request) const {
    const size_t n = request.prompt.size();
    if (n == 0) {
        throw UserError(ErrorKind::InvalidParameter, "the prompt is empty; give at least one token of text.");
    }
    if (n >= static_cast<size_t>(n_ctx())) {
        throw UserError(ErrorKind::PromptTooLong,
                        "the prompt has " + std::to_string(n) + " tokens but the context holds only " +
                            std::to_string(n_ctx()) + "; shorten the prompt or raise the context size (--ctx).");
    }
    if (request.prediction.size() > static_cast<size_t>(n_ctx())) {
        throw UserError(ErrorKind::InvalidParameter,
                        "the prediction has " + std::to_string(request.prediction.size()) +
                            " tokens but the context holds only " + std::to_string(n_ctx()) + ".");
    }
    const int n_vocab = target_.n_vocab();
    for (const auto* tokens : {&request.prompt, &request.prediction}) {
        for (Token t : *tokens) {
            if (t < 0 || t >= n_vocab) {
                throw UserError(ErrorKind::InvalidParameter,
                                std::string(tokens == &request.prompt ? "prompt" : "prediction") + " token id " +
                                    std::to_string(t) + " is outside the vocabulary (0.." +
                                    std::to_string(n_vocab - 1) + ").");
            }
        }
    }
}

// ---- batched generation ------------------------------------------------------------------

bool SpecEngine::slot_busy(int slot) const {
    return std::any_of(sequences_.begin(), sequences_.end(), [&](const auto& s) { return s->slot == slot; });
}

// A free slot: the one whose cache shares the longest prefix with the prompt (its KV is
// reused), the first free one when the request does not reuse the cache.
int SpecEngine::choose_slot(const GenerateRequest& request) const {
    int best = -1;
    size_t best_common = 0;
    for (int slot = 0; slot < n_seq(); ++slot) {
        if (slot_busy(slot)) continue;
        const size_t common = request.reuse_cache ? target_.common_prefix(request.prompt, slot) : 0;
        if (best < 0 || common > best_common) {
            best = slot;
            best_common = common;
        }
    }
    if (best < 0) throw std::logic_error("every generation slot is busy; wait for one to finish");
    return best;
}

// The caches of slots no generation holds are dropped when another slot starts one: their
// cells would stay in the shared cache, and every pass's attention spans the cells in use (a
// solo generation after a busy period ran ~25% slower). So, as with one slot, a cache is
// reused by the next request only if no other request started in between.
void SpecEngine::forget_idle_slots(int chosen) {
    for (int slot = 0; slot < n_seq(); ++slot) {
        if (slot != chosen && !target_.kv_tokens(slot).empty() && !slot_busy(slot)) clear_slot(slot);
    }
}

void SpecEngine::clear_slot(int slot) {
    target_.truncate(0, slot);
    if (Drafter* drafter = drafter_for(slot)) drafter->rollback({});
}

Drafter* SpecEngine::drafter_for(int slot) {
    if (drafter_) drafter_->select(slot);
    return drafter_.get();
}

int SpecEngine::start(const GenerateRequest& request, ChunkCallback on_chunk) {
    check_request(request);
    auto s = std::make_unique<Sequence>(next_id_, choose_slot(request), request, std::move(on_chunk));
    if (!request.grammar.empty()) s->grammar = std::make_unique<Grammar>(*target_model_, request.grammar);
    ++next_id_;
    s->result.stats.prompt_tokens = static_cast<int>(request.prompt.size());
    s->result.finish_reason = "length";
    // Plain requests leave the target's graph uninterrupted (no features for a head).
    if (n_seq() == 1) target_.set_tapping(request.draft_max > 0);
    if (request.adaptive && drafter_) calibrate(s->history, s->slot);
    if (!request.reuse_cache) clear_slot(s->slot);
    forget_idle_slots(s->slot);
    // The prompt's cached prefix is kept; the rest is prefilled by step().
    s->prefilled = target_.common_prefix(std::vector<Token>(s->history.begin(), s->history.end() - 1), s->slot);
    s->result.stats.cached_prompt_tokens = static_cast<int>(s->prefilled);
    if (request.adaptive) {
        controller_.swap_request(s->credit);
        controller_.begin_request();
        controller_.swap_request(s->credit);
    }
    s->start = Clock::now();
    sequences_.push_back(std::move(s));
    return next_id_ - 1;
}

// Both caches take each new prompt except its last token, which the first step verifies.
// One prompt per step; while other generations run, at most kPrefillChunk of its tokens.
int SpecEngine::prefill_joining() {
    constexpr int kPrefillChunk = 256;
    std::vector<Sequence*> joining;
    std::vector<int> remaining;
    bool others_running = false;
    for (const auto& s : sequences_) {
        if (s->finished) continue;
        if (!s->joining) {
            others_running = true;
            continue;
        }
        joining.push_back(s.get());
        remaining.push_back(static_cast<int>(s->history.size() - 1 - s->prefilled));
    }
    const std::vector<int> take = plan_prefill(remaining, others_running, kPrefillChunk);
    int prefilled = 0;
    for (size_t i = 0; i < joining.size(); ++i) {
        Sequence& s = *joining[i];
        if (take[i] == 0 && remaining[i] > 0) continue;
        const auto t0 = Clock::now();
        s.prefilled += static_cast<size_t>(take[i]);
        target_.sync(std::vector<Token>(s.history.begin(), s.history.begin() + static_cast<long>(s.prefilled)), 0,
                     s.slot);
        prefilled += take[i];
        const bool done = s.prefilled + 1 == s.history.size();
        if (Drafter* drafter = done ? drafter_for(s.slot) : nullptr) drafter->prefill(s.history);
        const auto t1 = Clock::now();
        s.result.stats.prefill_seconds += std::chrono::duration<double>(t1 - t0).count();
        if (done) {
            s.joining = false;
            s.gen_start = t1;
        }
    }
    return prefilled;
}

StepReport SpecEngine::step() {
    StepReport report;
    report.prefilled = prefill_joining();
    std::vector<Sequence*> batch;
    for (const auto& s : sequences_) {
        if (s->finished || s->joining) continue;
        if (s->result.stats.n_tokens >= s->request.max_tokens || static_cast<int>(s->history.size()) >= n_ctx()) {
            finish(*s, "length");
            continue;
        }
        batch.push_back(s.get());
    }
    batch = take_turns(batch);
    if (!batch.empty()) {
        const auto t0 = Clock::now();
        try {
            speculative_step(batch);
        } catch (...) {  // a failed pass leaves every generation in it undefined: drop them all
            sequences_.clear();
            throw;
        }
        last_step_seconds_ = seconds_since(t0);
        plan_turns(batch, last_step_seconds_);
        report.sequences = static_cast<int>(batch.size());
        for (const Sequence* s : batch) {
            report.rows += static_cast<int>(s->step.draft.tokens.size()) + 1;
            report.emitted += static_cast<int>(s->step.tokens.size());
        }
    }
    for (const auto& s : sequences_) {
        if (s->finished) report.finished.push_back(s->id);
    }
    return report;
}

// Fair turns. A client's grammar sets its generation's own work in a step (masking a large
// vocabulary for each of its rows, with as many parse states as the grammar has branches), and
// that work delays every generation in the step. After a step whose time t holds w of a
// grammar-shaped generation's own work, it sits out n = floor(w / (kFairShare * (t - w)))
// steps while the others run: their time per step then grows by at most kFairShare on average
// (w spread over n + 1 steps of t - w each), and the costly one still advances. A generation
// alone never waits, and one without a grammar never sits out (its own work is bounded by the
// vocabulary and its rows, not by what a client sent).
std::vector<Sequence*> SpecEngine::take_turns(const std::vector<Sequence*>& batch) {
    if (batch.size() < 2) return batch;
    std::vector<Sequence*> taking;
    for (Sequence* s : batch) {
        if (!s->turns_started) {  // its first step: the cost its grammar showed when checked
            s->turns_started = true;
            s->sit_out = sit_out_steps(s->request.grammar_mask_seconds, last_step_seconds_);
        }
        if (s->sit_out > 0) {
            --s->sit_out;
        } else {
            taking.push_back(s);
        }
    }
    return taking.empty() ? batch : taking;
}

void SpecEngine::plan_turns(const std::vector<Sequence*>& batch, double step_seconds) {
    if (batch.size() < 2) return;
    for (Sequence* s : batch) {
        if (s->finished || !s->grammar) continue;
        s->sit_out = sit_out_steps(s->own_seconds, step_seconds - s->own_seconds);
    }
}

// n = floor(w / (kFairShare * others)), at most kLongestSitOut; none when either is unknown.
int SpecEngine::sit_out_steps(double own_seconds, double others_seconds) {
    constexpr double kFairShare = 0.2;
    constexpr int kLongestSitOut = 1000;
    if (own_seconds <= 0 || others_seconds <= 0) return 0;
    const double turns = own_seconds / (kFairShare * others_seconds);
    return static_cast<int>(std::min(turns, static_cast<double>(kLongestSitOut)));
}

GenerateResult SpecEngine::take_result(int id) {
    for (auto it = sequences_.begin(); it != sequences_.end(); ++it) {
        if ((*it)->id != id) continue;
        if (!(*it)->finished) throw std::logic_error("generation " + std::to_string(id) + " has not finished");
        GenerateResult result = std::move((*it)->result);
        sequences_.erase(it);
        return result;
    }
    throw std::out_of_range("no generation " + std::to_string(id));
}

void SpecEngine::cancel(int id) {
    for (const auto& s : sequences_) {
        if (s->id == id && !s->finished) finish(*s, "cancelled");
    }
}

GenerateResult SpecEngine::generate(const GenerateRequest& request, const ChunkCallback& on_chunk) {
    const int id = start(request, on_chunk);
    while (true) {
        const StepReport report = step();
        if (std::find(report.finished.begin(), report.finished.end(), id) != report.finished.end()) break;
    }
    return take_result(id);
}

}  // namespace localspec
