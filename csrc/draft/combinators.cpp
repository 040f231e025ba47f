// PerSlotDrafter and HybridDrafter (combinators.h).
#include "draft/combinators.h"

#include <algorithm>

namespace localspec {

// ---- one per slot -------------------------------------------------------------------------

PerSlotDrafter::PerSlotDrafter(int n_slots, Factory make) : make_(std::move(make)) {
    slots_.resize(static_cast<size_t>(std::max(1, n_slots)));
    slots_[0] = make_(0);  // the first one answers name(), head() and model_kind()
}

void PerSlotDrafter::select(int slot) {
    std::unique_ptr<Drafter>& drafter = slots_.at(static_cast<size_t>(slot));
    if (!drafter) drafter = make_(slot);
    slot_ = slot;
}

// ---- hybrid -------------------------------------------------------------------------------

Draft HybridDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    Draft out = ngram_.draft(history, k, params, rng);
    if (!out.tokens.empty()) return out;  // the model's cache catches up on its next draft
    return model_->draft(history, k, params, rng);
}

}  // namespace localspec
