// The n-gram drafter (prompt lookup): proposes what followed the latest earlier occurrence of
// the context's last tokens. Free to run: no model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "draft/recent_outputs.h"

namespace localspec {

// Prompt lookup: find the most recent earlier occurrence of the last n tokens (longest n
// first, from n_max down to n_min) and propose what followed it; when the context has none,
// the same lookup in the engine's recent outputs (`recent`, when given: recent_outputs.h).
class NgramDrafter : public Drafter {
public:
    NgramDrafter(int n_min, int n_max, std::shared_ptr<const RecentOutputs> recent = nullptr)
        : n_min_(n_min), n_max_(n_max), recent_(std::move(recent)) {}
    std::string name() const override { return "ngram"; }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    Draft lookup_draft(const std::vector<Token>& history, int k) override;

private:
    int n_min_;
    int n_max_;
    std::shared_ptr<const RecentOutputs> recent_;
};

}  // namespace localspec
