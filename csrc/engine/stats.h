// Per-generation statistics, named as in docs/design.md, "The speculative step" and "Benchmarks".
#pragma once

#include <array>
#include <vector>

#include "draft/draft_kind.h"

namespace localspec {

struct GenerationStats {
    int prompt_tokens = 0;
    int cached_prompt_tokens = 0;  // of those, found in the slot's cache (not prefilled again)
    int n_tokens = 0;       // emitted tokens
    int drafted = 0;
    int accepted = 0;       // drafted tokens that passed verification
    int rejected = 0;       // drafted - accepted
    int target_passes = 0;  // verification passes; each emits accepted + 1 tokens
    int last_drafted = 0;   // tokens drafted in the last step
    std::vector<int> accepted_length_histogram;  // [n]: steps that accepted n drafts
    std::vector<int> drafted_by_position;        // [i]: drafts made at position i of a step
    std::vector<int> accepted_by_position;       // [i]: of those, accepted
    double prefill_seconds = 0, draft_seconds = 0, verify_seconds = 0, other_seconds = 0;
    // Drafted and accepted tokens by who drafted them ([DraftKind::Source]).
    std::array<int, DraftKind::kSources> drafted_by_source{}, accepted_by_source{};
    // Drafts that ran a model (a draft model or a hidden-state head), not a free lookup: their
    // tokens and seconds give the draft cost c per drafted token.
    int model_drafted = 0;
    double model_draft_seconds = 0;
    // Verification rows whose logits were computed at the few tokens a grammar-forced text
    // allows there, not over the whole vocabulary (Draft::row_candidates).
    int candidate_rows = 0;
    double generation_seconds = 0;  // excludes prefill
    double time_to_first_token = 0;

    double acceptance_rate() const { return drafted ? static_cast<double>(accepted) / drafted : 0.0; }
    // Tokens per target pass (tau): each pass emits its accepted drafts and one token of the
    // target's, (accepted + passes) / passes; exactly 1.0 for plain decoding, also when the
    // last pass's token was the end of generation (counted in no output, n_tokens).
    double mean_accepted_length() const {
        return target_passes ? static_cast<double>(accepted + target_passes) / target_passes : 0.0;
    }
    double tokens_per_second() const { return generation_seconds > 0 ? n_tokens / generation_seconds : 0.0; }
    double prefill_tokens_per_second() const {
        return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0;
    }

    // A chained draft's first `forced` tokens count as grammar-forced, the rest as `kind`.
    void record_step(int n_drafted, int n_accepted, DraftKind kind, int forced = 0) {
        ++target_passes;
        const size_t lead = static_cast<size_t>(DraftKind::Source::Forced);
        drafted_by_source[lead] += forced;
        accepted_by_source[lead] += n_accepted < forced ? n_accepted : forced;
        drafted_by_source[static_cast<size_t>(kind.source)] += n_drafted - forced;
        accepted_by_source[static_cast<size_t>(kind.source)] += n_accepted > forced ? n_accepted - forced : 0;
        if (kind.runs_model()) model_drafted += n_drafted;
        drafted += n_drafted;
        accepted += n_accepted;
        rejected += n_drafted - n_accepted;
        grow(accepted_length_histogram, n_accepted + 1);
        ++accepted_length_histogram[static_cast<size_t>(n_accepted)];
        grow(drafted_by_position, n_drafted);
        grow(accepted_by_position, n_drafted);
        for (int i = 0; i < n_drafted; ++i) {
            ++drafted_by_position[static_cast<size_t>(i)];
            if (i < n_accepted) ++accepted_by_position[static_cast<size_t>(i)];
        }
    }

private:
    static void grow(std::vector<int>& v, int size) {
        if (static_cast<int>(v.size()) < size) v.resize(static_cast<size_t>(size), 0);
    }
};

}  // namespace localspec
