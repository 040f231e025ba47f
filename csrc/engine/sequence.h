// One generation in flight in the engine: its request and everything that belongs to it alone.
// Several sequences share the target's passes (batched generation); each keeps its own cache
// slot, history, random stream, grammar state, controller credit and statistics.
#pragma once

#include <memory>
#include <vector>

#include "sample/acceptance.h"
#include "base/clock.h"
#include "engine/controller.h"
#include "draft/drafter.h"
#include "engine/engine.h"
#include "engine/text_stream.h"

namespace localspec {

struct Sequence {
    Sequence(int id_, int slot_, const GenerateRequest& request_, ChunkCallback on_chunk_)
        : id(id_), slot(slot_), request(request_), on_chunk(std::move(on_chunk_)), history(request_.prompt),
          rng(request_.sampling.seed), stream(request_.stop) {}

    int id;
    int slot;  // the target context's sequence whose cache this generation uses
    GenerateRequest request;
    ChunkCallback on_chunk;
    // Prompt + emitted tokens. Once prefilled, the cache holds history[0 .. n-2] between steps
    // and history.back() is the newest token, not processed yet.
    std::vector<Token> history;
    size_t prefilled = 0;  // prompt tokens in the cache; the prompt's last is not prefilled
    bool joining = true;   // its prompt is still being prefilled
    bool finished = false;
    Rng rng;
    TextStream stream;
    std::unique_ptr<Grammar> grammar;  // the request's grammar in its current state, or null
    DraftController::RequestState credit;  // the controller's per-request state
    // A lookup proposal the controller declined: checked against the tokens the target emits
    // at its positions, it is free evidence of the kind's acceptance (resolve_unverified).
    struct Unverified {
        size_t start = 0;  // history index of its first token
        std::vector<Token> tokens;
        DraftKind kind;
    } unverified;
    GenerateResult result;
    Clock::time_point start, gen_start;
    // Fair turns (SpecEngine::take_turns): seconds of this generation's own work in the last
    // step (drafting, its rows' grammar and sampling, emitting: not the shared pass), and how
    // many steps it sits out so that the others sharing the engine keep their pace.
    double own_seconds = 0;
    int sit_out = 0;
    bool turns_started = false;  // its first turn was planned from the request's estimate

    // The current step.
    struct Step {
        Draft draft;
        int first_row = 0;  // of its rows [last, d1..dk] in the verification pass
        Acceptance acceptance;
        std::vector<Token> tokens;  // emitted: the accepted drafts and the correction or bonus
        std::vector<Provenance> provenance;
        std::vector<TokenLogprob> logprobs;  // one per token when the request asked for them
        double draft_seconds = 0, verify_seconds = 0;
    } step;
};

}  // namespace localspec
