// The speculative step: draft -> verify batch -> accept -> roll back -> emit, for every running
// generation at once (one of them, or several sharing the target's pass).
#include <algorithm>

#include "base/clock.h"
#include "base/errors.h"
#include "engine/engine.h"
#include "draft/forced_drafter.h"
#include "engine/sequence.h"
#include "sample/target_rows.h"

namespace localspec {

namespace {

// Drafts the grammar forbids are never verified: the draft ends before the first of them.
void trim_to_grammar(Draft& draft, const Grammar* grammar) {
    if (!grammar || draft.tokens.empty()) return;
    std::unique_ptr<Grammar> state = grammar->clone();
    size_t n = 0;
    for (; n < draft.tokens.size() && state->allows(draft.tokens[n]); ++n) state->accept(draft.tokens[n]);
    draft.tokens.resize(n);
    if (draft.q.size() > n) draft.q.resize(n);
    draft.forced = std::min(draft.forced, static_cast<int>(n));
}

// Rows whose logits the grammar-forced text lets verification compute at a few tokens alone
// (Draft::row_candidates): at most the draft's rows, and none when the request wants log
// probabilities (they need whole rows) or nothing is drafted: a one-row pass is the
// controller's measure of plain decoding, and one without the head would make every draft
// look expensive (it then stopped drafting altogether).
void keep_row_candidates(Sequence& s) {
    Draft& d = s.step.draft;
    if (s.request.logprobs >= 0 || !s.grammar || d.tokens.empty()) d.row_candidates.clear();
    if (d.row_candidates.size() > d.tokens.size() + 1) d.row_candidates.resize(d.tokens.size() + 1);
}

void cut(Sequence::Step& step, size_t n) {
    if (step.tokens.size() <= n) return;
    step.tokens.resize(n);
    step.provenance.resize(n);
    if (!step.logprobs.empty()) step.logprobs.resize(n);
}

}  // namespace

// Invariant on entry and exit, for every generation in `batch`: its cache slot holds
// history[0 .. n-2] and history.back() is the newest emitted token, not processed yet.
//
// A failure that belongs to one generation (its grammar, its drafter, its detokenized text, its
// caller's callback) ends that generation alone (finish_reason "error", SpecEngine::fail); the
// others go on with the step. Only a failed target pass ends them all (step()).
void SpecEngine::speculative_step(const std::vector<Sequence*>& batch) {
    // Exact mode keeps each generation's passes to itself (its own KV stream): the generations
    // take turns, a whole step each, exactly as each would run alone.
    if (batch.size() > 1 && !target_.shares_passes()) {
        for (Sequence* s : batch) speculative_step({s});
        return;
    }
    // 1. Draft: each generation as it would alone; then, when several share the pass, only the
    //    draft rows that pay for themselves in the batch's tokens per second.
    for (Sequence* s : batch) s->own_seconds = 0;
    std::vector<Sequence*> live = each_guarded(batch, [&](Sequence& s) { draft(s); });
    if (live.empty()) return;
    if (live.size() > 1) fit_drafts_to_batch(live);
    // 2. Verify: ONE target pass holding every generation's rows [last, d1..dk].
    const double pass_seconds = verify(live);
    // 3. Accept: each keeps n drafts plus one correction (after a rejection) or bonus token.
    live = each_guarded(live, [&](Sequence& s) {
        s.step.verify_seconds = pass_seconds;
        accept(s);
    });
    // 4. Roll back: each cache keeps `last` and its accepted drafts (after every row was read:
    //    dropping cache entries ends the pass's logits).
    live = each_guarded(live, [&](Sequence& s) { roll_back(s); });
    // 5. Emit.
    const bool shared = live.size() > 1;
    each_guarded(live, [&](Sequence& s) { emit(s, shared); });
}

// `work` for each generation in `batch`; one that throws is failed (SpecEngine::fail) and left
// out of the generations returned, which go on.
template <class Work>
std::vector<Sequence*> SpecEngine::each_guarded(const std::vector<Sequence*>& batch, Work&& work) {
    std::vector<Sequence*> live;
    live.reserve(batch.size());
    for (Sequence* s : batch) {
        const auto t0 = Clock::now();
        try {
            work(*s);
            s->own_seconds += seconds_since(t0);
            live.push_back(s);
        } catch (const UserError& e) {  // the request's own mistake (a grammar that cannot go on)
            fail(*s, true, e.what());
        } catch (const std::exception& e) {  // anything else: the generation ends, the step goes on
            fail(*s, false, e.what());
        }
    }
    return live;
}

// The generation ends with finish_reason "error" and one sentence, at most kErrorChars of it
// (`users`: the request's own mistake, a UserError; else a failure of the core);
// its cache slot is cleared, since a failure between the pass and the rollback leaves rows in
// it that no history accounts for.
void SpecEngine::fail(Sequence& s, bool users, const std::string& what) {
    constexpr size_t kErrorChars = 400;
    s.result.error_is_users = users;
    s.result.error = what.size() <= kErrorChars ? what : what.substr(0, kErrorChars) + "...";
    finish(s, "error");
    clear_slot(s.slot);
}

void SpecEngine::draft(Sequence& s) {
    const GenerateRequest& r = s.request;
    const GenerationStats& stats = s.result.stats;
    // The longest draft: draft_max, bounded by the room left in the context, by the tokens
    // still wanted and by how far a recurrent target can roll back (with "auto" the controller
    // picks within that).
    const int depth = target_.rollback_depth() < 0 ? r.draft_max : target_.rollback_depth();
    const int k_cap = std::max(0, std::min({r.draft_max, n_ctx() - static_cast<int>(s.history.size()),
                                            r.max_tokens - stats.n_tokens - 1, depth}));
    s.step = {};
    // Not timed: a drafter may build its tables here once (the forced drafter's read the whole
    // vocabulary, ~0.1 s, which as the cost of one drafted token stopped all forced drafting).
    if (Drafter* drafter = drafter_for(s.slot)) {
        drafter->begin_draft({s.id, s.grammar.get(), &r.prediction, &s.history, r.prompt.size()});
    }
    const auto t0 = Clock::now();
    controller_.swap_request(s.credit);
    s.step.draft = draft_tokens(s, k_cap);
    controller_.swap_request(s.credit);
    trim_to_grammar(s.step.draft, s.grammar.get());
    s.step.draft_seconds = seconds_since(t0);
}

// At most k_cap tokens. A free proposal comes first (n-gram lookup, alone or in the hybrid
// drafter) and the controller decides how much of it is worth verifying, knowing what kind of
// draft it is; without one, a draft model pays a pass per token, so its length is chosen
// before drafting. Each kind has its own acceptance and cost estimates.
Draft SpecEngine::draft_tokens(Sequence& s, int k_cap) {
    if (!drafter_ || k_cap <= 0) return {};
    if (!s.request.adaptive) return drafter_->draft(s.history, k_cap, s.request.sampling, s.rng);
    Draft draft = drafter_->lookup_draft(s.history, k_cap);
    if (!draft.tokens.empty()) {
        const int k = choose_lookup(draft);
        if (k == 0 && s.unverified.tokens.empty()) {  // the free evidence of its first part
            const size_t lead = draft.forced > 0 ? static_cast<size_t>(draft.forced) : draft.tokens.size();
            s.unverified = {s.history.size(), {draft.tokens.begin(), draft.tokens.begin() + static_cast<long>(lead)},
                            draft.forced > 0 ? DraftKind::forced() : draft.kind};
        }
        draft.tokens.resize(static_cast<size_t>(k));
        draft.forced = std::min(draft.forced, k);
        return draft;
    }
    if (!drafter_->has_model()) return draft;
    // A model that did not draft for a while first catches up over what was emitted meanwhile:
    // a one-time cost the controller weighs against this draft alone.
    const double setup = drafter_->catch_up_seconds(s.history);
    const int k = controller_.choose(drafter_->model_kind().slot(), k_cap, setup);
    if (k == 0) return {};
    draft = drafter_->model_draft(s.history, k, s.request.sampling, s.rng);
    draft.setup_seconds = setup;
    return draft;
}

// How much of a free proposal to verify. A grammar-forced lead is a kind of its own: the
// controller judges it first, and the rest (a lookup that continues after it) only when all of
// the lead is kept, as a draft of its own kind.
int SpecEngine::choose_lookup(const Draft& draft) {
    const int n = static_cast<int>(draft.tokens.size());
    if (draft.forced <= 0) return controller_.choose(draft.kind.slot(), n);
    const int lead = controller_.choose(DraftKind::forced().slot(), draft.forced);
    if (lead < draft.forced || n == draft.forced) return lead;
    return lead + controller_.choose(draft.kind.slot(), n - lead);
}

// The controller's acceptance of a draft's token j (a forced lead has its own kind).
double SpecEngine::draft_acceptance(const Draft& draft, size_t j) const {
    const int forced = draft.forced;
    if (static_cast<int>(j) < forced) return controller_.acceptance(DraftKind::forced().slot(), static_cast<int>(j));
    return controller_.acceptance(draft.kind.slot(), static_cast<int>(j) - forced);
}

// A drafted token's worth in a shared pass is the chance that it and every draft before it are
// accepted (the controller's mean estimates); batch_draft_lengths keeps the rows whose worth
// pays for their cost in the batch's pass (pass_cost_), down to none, and on one batched pass
// in kProbeEvery tries the best longer choice, so that pass_cost_ relearns what more rows
// cost. Fixed-length drafts (adaptive off) are kept as asked.
void SpecEngine::fit_drafts_to_batch(const std::vector<Sequence*>& batch) {
    std::vector<std::vector<double>> gains;
    std::vector<Sequence*> fitted;
    int base_rows = 0;
    double base_tokens = 0;
    for (Sequence* s : batch) {
        const Draft& d = s->step.draft;
        std::vector<double> g;
        double reach = 1.0;
        for (size_t j = 0; j < d.tokens.size(); ++j) {
            reach *= draft_acceptance(d, j);
            g.push_back(reach);
        }
        base_rows += 1;
        base_tokens += 1;
        if (s->request.adaptive) {
            gains.push_back(std::move(g));
            fitted.push_back(s);
        } else {
            base_rows += static_cast<int>(g.size());
            for (double x : g) base_tokens += x;
        }
    }
    const bool probe = ++batched_passes_ % kProbeEvery == 0;
    const std::vector<int> lengths = batch_draft_lengths(gains, pass_cost_, base_rows, base_tokens, probe);
    for (size_t i = 0; i < fitted.size(); ++i) {
        Draft& d = fitted[i]->step.draft;
        d.tokens.resize(std::min(d.tokens.size(), static_cast<size_t>(lengths[i])));
        if (d.q.size() > d.tokens.size()) d.q.resize(d.tokens.size());
        d.forced = std::min(d.forced, static_cast<int>(d.tokens.size()));
    }
}

// One target pass; row i of a generation's rows is the target's distribution for the position
// of d_{i+1} (row k follows d_k). Where the grammar forces text, a row's logits are computed
// at the tokens it can allow alone. Returns its seconds.
double SpecEngine::verify(const std::vector<Sequence*>& batch) {
    std::vector<SeqRows> pieces;
    int rows = 0;
    for (Sequence* s : batch) {
        SeqRows piece{s->slot, {s->history.back()}, {}};
        const std::vector<Token>& drafted = s->step.draft.tokens;
        piece.tokens.insert(piece.tokens.end(), drafted.begin(), drafted.end());
        keep_row_candidates(*s);
        piece.only = s->step.draft.row_candidates;
        s->step.first_row = rows;
        rows += static_cast<int>(piece.tokens.size());
        pieces.push_back(std::move(piece));
    }
    const auto t0 = Clock::now();
    target_.decode_rows(pieces);
    const double seconds = seconds_since(t0);
    if (target_.last_chosen_rows() > 0) {  // every row with candidates was computed at them
        for (Sequence* s : batch) {
            for (const auto& c : s->step.draft.row_candidates) s->result.stats.candidate_rows += c.empty() ? 0 : 1;
        }
    }
    if (target_.shares_passes()) pass_cost_.observe(rows, seconds);
    return seconds;
}

// Row i is shaped (penalties, grammar) as plain decoding would shape it there. Reading the
// rows scales with k, so it counts as verification time.
void SpecEngine::accept(Sequence& s) {
    const auto t0 = Clock::now();
    const std::vector<Token>& drafted = s.step.draft.tokens;
    const SamplingParams& params = s.request.sampling;
    TargetRows rows(target_, s.step.first_row, s.history, drafted, params, s.grammar.get(),
                    &s.step.draft.row_candidates);
    Acceptance acc;
    if (params.greedy()) {
        acc = accept_greedy(drafted, [&](size_t i) { return rows.argmax(i); });
    } else {
        // p_i is warped only when the rule reaches row i (never past the first rejection).
        auto p = [&](size_t i) { return rows.warped(i); };
        if (s.step.draft.q.empty()) {  // deterministic drafts (or none): seed-reproducible coupling
            std::vector<double> u(drafted.size() + 1);
            for (size_t i = 0; i < u.size(); ++i) u[i] = position_uniform(params.seed, s.history.size() + i);
            acc = accept_coupled(drafted, p, u);
        } else {
            acc = accept_sampled(drafted, p, s.step.draft.q, s.rng);
        }
    }
    rows.emit(acc.token);
    s.step.acceptance = acc;
    s.step.tokens.assign(drafted.begin(), drafted.begin() + acc.n_accepted);
    s.step.provenance.assign(static_cast<size_t>(acc.n_accepted), Provenance::Draft);
    s.step.tokens.push_back(acc.token);
    s.step.provenance.push_back(Provenance::Target);
    if (s.request.logprobs >= 0) s.step.logprobs = step_logprobs(s, s.request.logprobs);
    s.step.verify_seconds += seconds_since(t0);
}

// The cache keeps `last` and the accepted drafts; rejected rows go. The drafter drops whatever
// it cached beyond the new history.
void SpecEngine::roll_back(Sequence& s) {
    const auto t0 = Clock::now();
    const int drafted = static_cast<int>(s.step.draft.tokens.size());
    const int n_accepted = s.step.acceptance.n_accepted;
    target_.truncate(s.history.size() + static_cast<size_t>(n_accepted), s.slot);
    s.history.insert(s.history.end(), s.step.tokens.begin(), s.step.tokens.end());
    if (Drafter* drafter = drafter_for(s.slot)) drafter->rollback(s.history);

    GenerationStats& stats = s.result.stats;
    stats.last_drafted = drafted;
    stats.record_step(drafted, n_accepted, s.step.draft.kind, s.step.draft.forced);
    stats.draft_seconds += s.step.draft_seconds;
    if (s.step.draft.kind.runs_model()) stats.model_draft_seconds += s.step.draft_seconds;
    stats.verify_seconds += s.step.verify_seconds;
    stats.other_seconds += seconds_since(t0);
}

// Learn from the step, cut at end-of-generation (not emitted), max_tokens and stop strings,
// and hand the chunk to the caller. In a shared pass the seconds belong to every generation in
// it: the controller's costs then stay those of passes alone (pass_cost_ learns the batch's).
void SpecEngine::emit(Sequence& s, bool shared_pass) {
    Sequence::Step& step = s.step;
    GenerateResult& result = s.result;
    GenerationStats& stats = result.stats;
    const GenerateRequest& r = s.request;
    const int drafted = static_cast<int>(step.draft.tokens.size());
    result.pass_rows.push_back(drafted + 1);
    result.pass_emitted.push_back(static_cast<int>(step.tokens.size()));
    controller_.swap_request(s.credit);
    const double verify_seconds = shared_pass ? controller_.verify_seconds(drafted + 1) : step.verify_seconds;
    controller_.observe(drafted, step.acceptance.n_accepted, step.draft_seconds, verify_seconds,
                        step.draft.kind.slot(), {step.draft.forced, DraftKind::forced().slot()},
                        step.draft.setup_seconds);
    resolve_unverified(s);
    controller_.swap_request(s.credit);

    std::string reason;
    for (size_t i = 0; i < step.tokens.size(); ++i) {
        if (!r.ignore_eos && target_model_->is_end_of_generation(step.tokens[i])) {
            cut(step, i);
            reason = "stop";
            break;
        }
    }
    cut(step, static_cast<size_t>(r.max_tokens - stats.n_tokens));
    std::string piece_bytes;
    for (Token t : step.tokens) piece_bytes += target_model_->token_piece(t);
    std::string text = s.stream.push(piece_bytes);
    if (s.stream.stopped()) reason = "stop";
    stats.n_tokens += static_cast<int>(step.tokens.size());
    if (reason.empty() && (stats.n_tokens >= r.max_tokens || static_cast<int>(s.history.size()) >= n_ctx())) {
        reason = "length";
    }
    if (!reason.empty()) text += s.stream.flush();
    stats.generation_seconds = seconds_since(s.gen_start);
    if (stats.target_passes == 1) stats.time_to_first_token = seconds_since(s.start);

    result.tokens.insert(result.tokens.end(), step.tokens.begin(), step.tokens.end());
    result.provenance.insert(result.provenance.end(), step.provenance.begin(), step.provenance.end());
    result.logprobs.insert(result.logprobs.end(), step.logprobs.begin(), step.logprobs.end());
    result.text += text;
    const bool keep_going =
        s.on_chunk ? s.on_chunk(Chunk{text, step.tokens, step.provenance, stats, step.logprobs}) : true;
    if (reason.empty() && !keep_going) reason = "cancelled";
    if (!reason.empty()) finish(s, reason);
}

void SpecEngine::finish(Sequence& s, const std::string& reason) {
    s.finished = true;
    s.result.finish_reason = reason;
    if (recent_ && reason != "error") recent_->add(s.result.tokens);
    if (!s.joining) s.result.stats.generation_seconds = seconds_since(s.gen_start);
}

// Log probabilities of the tokens the step emitted (row j: tokens[j]), from the target's raw
// logits (before penalties, grammar and sampling settings), as OpenAI reports.
std::vector<TokenLogprob> SpecEngine::step_logprobs(const Sequence& s, int n_top) const {
    std::vector<TokenLogprob> out;
    out.reserve(s.step.tokens.size());
    for (size_t j = 0; j < s.step.tokens.size(); ++j) {
        const float* row = target_.logits(s.step.first_row + static_cast<int>(j));
        out.push_back(token_logprob(row, target_.n_vocab(), s.step.tokens[j], n_top));
    }
    return out;
}

// A declined lookup proposal would have had its first n tokens accepted iff the target emitted
// exactly those n tokens at its positions: at temperature 0 the target's argmax, at T > 0 its
// position-coupled sample (the same uniform for a position whether drafted or not). So once the
// history reaches a mismatch, or covers the whole proposal, the controller learns as if it had
// drafted it, at no cost.
void SpecEngine::resolve_unverified(Sequence& s) {
    auto& u = s.unverified;
    const auto& d = u.tokens;
    if (d.empty()) return;
    size_t n = 0;
    while (n < d.size() && u.start + n < s.history.size() && s.history[u.start + n] == d[n]) ++n;
    const bool decided = n == d.size() || u.start + n < s.history.size();
    if (!decided) return;
    controller_.observe_acceptance(static_cast<int>(d.size()), static_cast<int>(n), u.kind.slot());
    u.tokens.clear();
}

}  // namespace localspec
