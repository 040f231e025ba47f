#include "engine.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>

#include "acceptance.h"
#include "eagle3_drafter.h"
#include "errors.h"
#include "target_rows.h"
#include "text_stream.h"
#include "vocab_check.h"

namespace localspec {

// The drafter spelling: "none", "ngram", "hybrid:PATH" (n-gram when it matches, else the draft
// at PATH), "eagle3:PATH" (n-gram when it matches, else the EAGLE-3 head at PATH) or PATH (the
// draft model or EAGLE-3 head at PATH alone, as a bare draft model drafts alone). Whether PATH
// is a head is read from its header, once.
struct DrafterSpec {
    std::string kind;  // "none", "ngram", "model" or "eagle3"
    std::string path;
    bool with_ngram = false;
    std::optional<Eagle3Info> head;  // for kind "eagle3"
};

namespace {

using Clock = std::chrono::steady_clock;

// Exact mode's attention settings (docs/exact.md has the measurements behind them).
constexpr int kExactFlashAttn = 1;
constexpr const char* kExactKvType = "q8_0";

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

std::shared_ptr<Model> load_target(const EngineOptions& options) {
    backend_init(options.verbose);
    ModelOptions model{options.target_path, options.n_gpu_layers_target};
    model.repack = options.repack && !options.exact;
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

// The target's context: the numerics knobs, or exact mode's fixed choice (docs/exact.md); with
// an EAGLE-3 head it records the hidden states the head reads.
ContextOptions target_options(const EngineOptions& options, const DrafterSpec& spec, const Model& target) {
    ContextOptions out = context_options(options, options.fast_head || options.exact);
    out.flash_attn = options.exact ? kExactFlashAttn : options.flash_attn;
    out.kv_type = options.exact ? kExactKvType : options.kv_type;
    out.exact = options.exact;
    if (spec.head) {
        check_head_fits(spec.path, *spec.head, target);
        out.tap_layers = spec.head->target_layers;
    }
    return out;
}

std::unique_ptr<Drafter> make_drafter(const EngineOptions& options, const DrafterSpec& spec, const Model& target,
                                      Context& target_ctx) {
    if (spec.kind == "none") return nullptr;
    if (spec.kind == "ngram") return std::make_unique<NgramDrafter>(options.ngram_min, options.ngram_max);
    auto draft = std::make_shared<Model>(ModelOptions{spec.path, options.n_gpu_layers_draft});
    check_vocab_compatible(target, *draft);
    std::unique_ptr<Drafter> model;
    if (spec.kind == "eagle3") {
        model = std::make_unique<Eagle3Drafter>(draft, target_ctx, options.n_threads, options.draft_sampling,
                                                options.draft_p_min);
    } else {
        model = std::make_unique<ModelDrafter>(draft, context_options(options, options.fast_head),
                                               target.vocab().n_tokens, options.draft_sampling, options.draft_p_min);
    }
    if (!spec.with_ngram) return model;
    const std::string name = spec.kind == "eagle3" ? model->name() : "hybrid:" + model->name();
    return std::make_unique<HybridDrafter>(NgramDrafter(options.ngram_min, options.ngram_max), std::move(model), name);
}

}  // namespace

namespace {

DrafterSpec parse_drafter(const std::string& drafter) {
    if (drafter == "none" || drafter == "ngram") return {drafter, "", false, std::nullopt};
    bool with_ngram = false;
    std::string path = drafter;
    for (const std::string prefix : {"hybrid:", "eagle3:"}) {
        if (drafter.rfind(prefix, 0) == 0) {
            with_ngram = true;
            path = drafter.substr(prefix.size());
        }
    }
    std::optional<Eagle3Info> head = read_eagle3_info(path);
    return {head ? "eagle3" : "model", path, with_ngram, std::move(head)};
}

}  // namespace

SpecEngine::SpecEngine(const EngineOptions& options) : SpecEngine(options, parse_drafter(options.drafter)) {}

SpecEngine::SpecEngine(const EngineOptions& options, const DrafterSpec& drafter)
    : exact_(options.exact),
      target_model_(load_target(options)),
      target_(*target_model_, target_options(options, drafter, *target_model_)),
      drafter_(make_drafter(options, drafter, *target_model_, target_)),
      controller_(drafter_ ? options.controller_k_max : 0) {}

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
    const int n_vocab = target_.n_vocab();
    for (Token t : request.prompt) {
        if (t < 0 || t >= n_vocab) {
            throw UserError(ErrorKind::InvalidParameter, "prompt token id " + std::to_string(t) +
                                                             " is outside the vocabulary (0.." +
                                                             std::to_string(n_vocab - 1) + ").");
        }
    }
}

// At most k_cap tokens. A free proposal comes first (n-gram lookup, alone or in the hybrid
// drafter) and the controller decides how much of it is worth verifying, knowing what kind of
// draft it is; without one, a draft model pays a pass per token, so its length is chosen
// before drafting. Each kind has its own acceptance and cost estimates.
Draft SpecEngine::draft_tokens(const std::vector<Token>& history, int k_cap, bool adaptive,
                               const SamplingParams& params, Rng& rng) {
    if (!drafter_ || k_cap <= 0) return {};
    if (!adaptive) return drafter_->draft(history, k_cap, params, rng);
    Draft draft = drafter_->lookup_draft(history, k_cap);
    if (!draft.tokens.empty()) {
        const int k = controller_.choose(draft.kind, static_cast<int>(draft.tokens.size()));
        if (k == 0 && unverified_.tokens.empty()) unverified_ = {history.size(), draft.tokens, draft.kind};
        draft.tokens.resize(static_cast<size_t>(k));
        return draft;
    }
    if (!drafter_->has_model()) return draft;
    const int k = controller_.choose(0, k_cap);
    return k > 0 ? drafter_->model_draft(history, k, params, rng) : Draft{};
}

// One speculative step: draft -> verify batch -> accept -> roll back -> emit.
// Invariant on entry and exit: the target cache holds history[0 .. n-2] and history.back() is
// the newest emitted token, which the target has not processed yet.
SpecEngine::StepResult SpecEngine::speculative_step(std::vector<Token>& history, int k_cap,
                                                    bool adaptive, const SamplingParams& params,
                                                    Rng& rng, GenerationStats& stats) {
    // 1. Draft up to k_cap tokens (q kept when the drafter sampled).
    auto t0 = Clock::now();
    Draft draft = draft_tokens(history, k_cap, adaptive, params, rng);
    trim_to_grammar(draft);
    const std::vector<Token>& drafted = draft.tokens;
    StepResult out;
    out.drafted = static_cast<int>(drafted.size());
    out.kind = draft.kind;
    stats.draft_max = out.drafted;
    out.draft_seconds = seconds_since(t0);

    // 2. Verify: ONE target batch [last, d1..dk] with logits on every row; row i is the
    //    target's distribution for the position of d_{i+1} (row k follows d_k).
    t0 = Clock::now();
    std::vector<Token> batch{history.back()};
    batch.insert(batch.end(), drafted.begin(), drafted.end());
    const int n_rows = static_cast<int>(batch.size());
    out.rows = n_rows;
    target_.decode(batch, n_rows);

    // 3. Accept: n drafts kept, plus one correction (after a rejection) or bonus token.
    //    (Reading k + 1 logits rows scales with k, so it counts as verification time.)
    //    Row i is shaped (penalties, grammar) as plain decoding would shape it there.
    TargetRows rows(target_, history, drafted, params, grammar_.get());
    Acceptance acc;
    if (params.greedy()) {
        acc = accept_greedy(drafted, [&](size_t i) { return rows.argmax(i); });
    } else {
        // p_i is warped only when the rule reaches row i (never past the first rejection).
        auto p = [&](size_t i) { return rows.warped(i); };
        if (draft.q.empty()) {  // deterministic drafts (or none): seed-reproducible coupling
            std::vector<double> u(static_cast<size_t>(n_rows));
            for (size_t i = 0; i < u.size(); ++i) u[i] = position_uniform(params.seed, history.size() + i);
            acc = accept_coupled(drafted, p, u);
        } else {
            acc = accept_sampled(drafted, p, draft.q, rng);
        }
    }
    rows.emit(acc.token);
    if (n_logprobs_ >= 0) {  // rows 0..n emitted d_1..d_n and the target's token
        std::vector<Token> emitted(drafted.begin(), drafted.begin() + acc.n_accepted);
        emitted.push_back(acc.token);
        out.logprobs = step_logprobs(emitted, n_logprobs_);
    }
    out.verify_seconds = seconds_since(t0);
    t0 = Clock::now();

    // 4. Roll back: the target keeps `last` and the accepted drafts; rejected rows go. The
    //    drafter drops whatever it cached beyond the new history.
    const size_t n = static_cast<size_t>(acc.n_accepted);
    target_.truncate(history.size() + n);
    out.tokens.assign(drafted.begin(), drafted.begin() + static_cast<long>(n));
    out.provenance.assign(n, Provenance::Draft);
    out.tokens.push_back(acc.token);
    out.provenance.push_back(Provenance::Target);
    history.insert(history.end(), out.tokens.begin(), out.tokens.end());
    if (drafter_) drafter_->rollback(history);

    // 5. Emit (the caller streams `out`); record what speculation did.
    stats.record_step(out.drafted, acc.n_accepted);
    stats.draft_seconds += out.draft_seconds;
    if (draft.kind == 0 && out.drafted > 0) {  // kind 0: a model drafted (lookups report their match length)
        stats.model_drafted += out.drafted;
        stats.model_draft_seconds += out.draft_seconds;
    }
    stats.verify_seconds += out.verify_seconds;
    stats.other_seconds += seconds_since(t0);
    return out;
}

GenerateResult SpecEngine::generate(const GenerateRequest& request, const ChunkCallback& on_chunk) {
    check_request(request);
    GenerateResult result;
    GenerationStats& stats = result.stats;
    stats.prompt_tokens = static_cast<int>(request.prompt.size());
    Rng rng(request.sampling.seed);
    TextStream stream(request.stop);
    std::vector<Token> history = request.prompt;
    grammar_ = request.grammar.empty() ? nullptr : std::make_unique<Grammar>(*target_model_, request.grammar);
    n_logprobs_ = request.logprobs;

    // Plain requests leave the target's graph uninterrupted (no features for a head).
    target_.set_tapping(request.draft_max > 0);
    if (request.adaptive && drafter_) calibrate(history);
    // Prefill: both caches take the prompt except its last token, which the first step verifies.
    const auto start = Clock::now();
    if (!request.reuse_cache) {
        target_.truncate(0);
        if (drafter_) drafter_->rollback({});
    }
    target_.sync(std::vector<Token>(history.begin(), history.end() - 1), 0);
    if (drafter_) drafter_->prefill(history);
    stats.prefill_seconds = seconds_since(start);
    const auto gen_start = Clock::now();

    result.finish_reason = "length";
    const int n_ctx = target_.n_ctx();
    if (request.adaptive) controller_.begin_request();
    unverified_.tokens.clear();
    while (stats.n_tokens < request.max_tokens) {
        if (static_cast<int>(history.size()) >= n_ctx) break;  // context full
        // The longest draft: draft_max, bounded by the room left in the context and by the
        // tokens still wanted (with "auto" the controller picks within that).
        const int k_cap = std::max(0, std::min({request.draft_max, n_ctx - static_cast<int>(history.size()),
                                                request.max_tokens - stats.n_tokens - 1}));
        StepResult step = speculative_step(history, k_cap, request.adaptive, request.sampling, rng, stats);
        result.pass_rows.push_back(step.rows);
        result.pass_emitted.push_back(static_cast<int>(step.tokens.size()));
        const int n_accepted = static_cast<int>(step.tokens.size()) - 1;  // + 1 target token
        controller_.observe(step.drafted, n_accepted, step.draft_seconds, step.verify_seconds, step.kind);
        resolve_unverified(history);
        std::vector<TokenLogprob>& logprobs = step.logprobs;

        // Cut at end-of-generation (not emitted) and at max_tokens.
        bool finished = false;
        for (size_t i = 0; i < step.tokens.size(); ++i) {
            if (!request.ignore_eos && target_model_->is_end_of_generation(step.tokens[i])) {
                step.tokens.resize(i);
                step.provenance.resize(i);
                if (!logprobs.empty()) logprobs.resize(i);
                result.finish_reason = "stop";
                finished = true;
                break;
            }
        }
        const size_t room = static_cast<size_t>(request.max_tokens - stats.n_tokens);
        if (step.tokens.size() > room) {
            step.tokens.resize(room);
            step.provenance.resize(room);
            if (!logprobs.empty()) logprobs.resize(room);
        }
        std::string piece_bytes;
        for (Token t : step.tokens) piece_bytes += target_model_->token_piece(t);
        std::string text = stream.push(piece_bytes);
        if (stream.stopped()) {
            result.finish_reason = "stop";
            finished = true;
        }
        stats.n_tokens += static_cast<int>(step.tokens.size());
        finished = finished || stats.n_tokens >= request.max_tokens ||
                   static_cast<int>(history.size()) >= n_ctx;
        if (finished) text += stream.flush();
        stats.generation_seconds = seconds_since(gen_start);
        if (stats.target_passes == 1) stats.time_to_first_token = stats.prefill_seconds + stats.generation_seconds;

        result.tokens.insert(result.tokens.end(), step.tokens.begin(), step.tokens.end());
        result.provenance.insert(result.provenance.end(), step.provenance.begin(), step.provenance.end());
        result.logprobs.insert(result.logprobs.end(), logprobs.begin(), logprobs.end());
        result.text += text;
        const bool keep_going =
            on_chunk ? on_chunk(Chunk{text, step.tokens, step.provenance, stats, logprobs}) : true;
        if (finished) break;
        if (!keep_going) {
            result.finish_reason = "cancelled";
            break;
        }
    }
    stats.generation_seconds = seconds_since(gen_start);
    return result;
}

// Drafts the grammar forbids are never verified: the draft ends before the first of them.
void SpecEngine::trim_to_grammar(Draft& draft) {
    if (!grammar_ || draft.tokens.empty()) return;
    std::unique_ptr<Grammar> state = grammar_->clone();
    size_t n = 0;
    for (; n < draft.tokens.size() && state->allows(draft.tokens[n]); ++n) state->accept(draft.tokens[n]);
    draft.tokens.resize(n);
    if (draft.q.size() > n) draft.q.resize(n);
}

// Log probabilities of the tokens the last verification pass emitted (row j: tokens[j]), from
// the target's raw logits (before penalties, grammar and sampling settings), as OpenAI reports.
std::vector<TokenLogprob> SpecEngine::step_logprobs(const std::vector<Token>& tokens, int n_top) const {
    std::vector<TokenLogprob> out;
    out.reserve(tokens.size());
    for (size_t j = 0; j < tokens.size(); ++j) {
        out.push_back(token_logprob(target_.logits(static_cast<int>(j)), target_.n_vocab(), tokens[j], n_top));
    }
    return out;
}

// A declined lookup proposal would have had its first n tokens accepted iff the target emitted
// exactly those n tokens at its positions: at temperature 0 the target's argmax, at T > 0 its
// position-coupled sample (the same uniform for a position whether drafted or not). So once the
// history reaches a mismatch, or covers the whole proposal, the controller learns as if it had
// drafted it, at no cost.
void SpecEngine::resolve_unverified(const std::vector<Token>& history) {
    const auto& d = unverified_.tokens;
    if (d.empty()) return;
    size_t n = 0;
    while (n < d.size() && unverified_.start + n < history.size() && history[unverified_.start + n] == d[n]) ++n;
    const bool decided = n == d.size() || unverified_.start + n < history.size();
    if (!decided) return;
    controller_.observe_acceptance(static_cast<int>(d.size()), static_cast<int>(n), unverified_.kind);
    unverified_.tokens.clear();
}

// Once per engine (unless restored memory already has them): time a pass over every row count
// the controller may choose, so that its worst-case bound uses measured costs from the first
// step. The context is the prompt (repeated if short), so the prefill that follows reuses it.
// Interference from other processes only ever adds time, and more rows never cost less: each
// row count keeps its fastest of three passes, and no count is cheaper than a smaller one (a
// preempted 1-row pass would otherwise make drafting look free).
void SpecEngine::calibrate(const std::vector<Token>& prompt) {
    const int rows = controller_.k_max() + 1;
    if (controller_.memory().verify.back() > 0) return;
    std::vector<Token> context;
    while (static_cast<int>(context.size()) < rows + 1) context.insert(context.end(), prompt.begin(), prompt.end());
    if (static_cast<int>(context.size()) >= n_ctx()) return;
    std::vector<double> fastest = pass_seconds(context, rows, 1);
    for (int repeat = 1; repeat < 3; ++repeat) {
        const std::vector<double> seconds = pass_seconds(context, rows, 1);
        for (size_t r = 1; r < fastest.size(); ++r) fastest[r] = std::min(fastest[r], seconds[r]);
    }
    for (size_t r = 2; r < fastest.size(); ++r) fastest[r] = std::max(fastest[r], fastest[r - 1]);
    for (int r = 1; r <= rows; ++r) controller_.seed_verify_seconds(r, fastest[static_cast<size_t>(r)]);
}

std::vector<float> SpecEngine::next_token_logits(const std::vector<Token>& tokens, int batch_rows) {
    GenerateRequest probe;
    probe.prompt = tokens;
    check_request(probe);
    const size_t rows = static_cast<size_t>(std::clamp(batch_rows, 1, static_cast<int>(tokens.size())));
    const std::vector<Token> head(tokens.begin(), tokens.end() - static_cast<long>(rows));
    target_.sync(head, 0);
    target_.decode(std::vector<Token>(tokens.end() - static_cast<long>(rows), tokens.end()), static_cast<int>(rows));
    const float* row = target_.logits(static_cast<int>(rows) - 1);
    return std::vector<float>(row, row + target_.n_vocab());
}

std::vector<float> SpecEngine::pass_logits(const std::vector<Token>& tokens, int rows) {
    GenerateRequest probe;
    probe.prompt = tokens;
    check_request(probe);
    const size_t n = static_cast<size_t>(std::clamp(rows, 1, static_cast<int>(tokens.size())));
    target_.sync(std::vector<Token>(tokens.begin(), tokens.end() - static_cast<long>(n)), 0);
    target_.decode(std::vector<Token>(tokens.end() - static_cast<long>(n), tokens.end()), static_cast<int>(n));
    const size_t n_vocab = static_cast<size_t>(target_.n_vocab());
    std::vector<float> out(n * n_vocab);
    for (size_t r = 0; r < n; ++r) {
        const float* row = target_.logits(static_cast<int>(r));
        std::copy(row, row + n_vocab, out.begin() + static_cast<long>(r * n_vocab));
    }
    return out;
}

std::vector<double> SpecEngine::pass_seconds(const std::vector<Token>& context, int max_rows, int repeats) {
    GenerateRequest probe;
    probe.prompt = context;
    check_request(probe);
    if (max_rows < 1 || max_rows >= static_cast<int>(context.size()) || repeats < 1) {
        throw std::invalid_argument("pass_seconds needs 1 <= max_rows < the context's length and repeats >= 1");
    }
    std::vector<std::vector<double>> samples(static_cast<size_t>(max_rows) + 1);
    for (int repeat = 0; repeat < repeats; ++repeat) {
        for (int rows = 1; rows <= max_rows; ++rows) {
            const auto split = context.end() - rows;
            target_.sync(std::vector<Token>(context.begin(), split), 0);
            const auto t0 = Clock::now();
            target_.decode(std::vector<Token>(split, context.end()), rows);
            for (int i = 0; i < rows; ++i) argmax(target_.logits(i), target_.n_vocab());
            samples[static_cast<size_t>(rows)].push_back(seconds_since(t0));
        }
    }
    std::vector<double> medians(samples.size(), 0.0);
    for (size_t rows = 1; rows < samples.size(); ++rows) {
        auto& s = samples[rows];
        std::nth_element(s.begin(), s.begin() + static_cast<long>(s.size() / 2), s.end());
        medians[rows] = s[s.size() / 2];
    }
    return medians;
}

int SpecEngine::replay_greedy(const std::vector<Token>& prompt, const std::vector<Token>& tokens,
                              const std::vector<int>& pass_rows, const std::vector<int>& pass_emitted) {
    GenerateRequest probe;
    probe.prompt = prompt;
    check_request(probe);
    target_.truncate(0);
    std::vector<Token> history = prompt;
    target_.decode(std::vector<Token>(history.begin(), history.end() - 1), 0);
    size_t next = 0;  // index of the next emitted token to check
    for (size_t pass = 0; pass < pass_rows.size() && next < tokens.size(); ++pass) {
        // [last, the tokens this pass emitted, filler up to the pass's rows]: rows after the
        // checked ones cannot influence them (causal attention), they only give the same shape.
        const int rows = pass_rows[pass];
        std::vector<Token> batch{history.back()};
        for (int i = 1; i < rows; ++i) {
            const size_t idx = next + static_cast<size_t>(i) - 1;
            batch.push_back(idx < tokens.size() ? tokens[idx] : history.back());
        }
        const size_t kept = history.size() - 1;
        target_.decode(batch, rows);
        const int n = std::min(pass_emitted[pass], rows);
        for (int i = 0; i < n && next < tokens.size(); ++i, ++next) {
            if (argmax(target_.logits(i), target_.n_vocab()) != tokens[next]) return static_cast<int>(next);
            history.push_back(tokens[next]);
        }
        target_.truncate(kept + static_cast<size_t>(n));
    }
    return -1;
}

}  // namespace localspec
