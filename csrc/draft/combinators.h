// Drafters made of other drafters: one per generation slot (PerSlotDrafter), and n-gram lookup
// first with a drafter that runs a model behind it (HybridDrafter).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "draft/ngram_drafter.h"

namespace localspec {

// One drafter per generation slot, each made when its slot first comes up (batched serving
// with a drafter whose state follows one generation: an EAGLE-3 head's or MTP layers' context).
// Every call goes to the selected slot's drafter.
class PerSlotDrafter : public Drafter {
public:
    using Factory = std::function<std::unique_ptr<Drafter>(int slot)>;
    PerSlotDrafter(int n_slots, Factory make);
    std::string name() const override { return slots_[0]->name(); }
    void select(int slot) override;
    void begin_draft(const DraftInputs& inputs) override { current().begin_draft(inputs); }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return current().draft(history, k, params, rng);
    }
    Draft lookup_draft(const std::vector<Token>& history, int k) override { return current().lookup_draft(history, k); }
    bool has_model() const override { return slots_[0]->has_model(); }
    double catch_up_seconds(const std::vector<Token>& history) const override {
        return slots_[static_cast<size_t>(slot_)]->catch_up_seconds(history);
    }
    DraftKind model_kind() const override { return slots_[0]->model_kind(); }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return current().model_draft(history, k, params, rng);
    }
    void rollback(const std::vector<Token>& history) override { current().rollback(history); }
    void prefill(const std::vector<Token>& history) override { current().prefill(history); }
    std::string head() const override { return slots_[0]->head(); }

private:
    Drafter& current() { return *slots_[static_cast<size_t>(slot_)]; }
    Factory make_;
    std::vector<std::unique_ptr<Drafter>> slots_;
    int slot_ = 0;
};

// n-gram lookup when the context has a match (free, and often long when the output copies
// the prompt), a drafter that runs a model otherwise (a draft model or an EAGLE-3 head).
class HybridDrafter : public Drafter {
public:
    HybridDrafter(NgramDrafter ngram, std::unique_ptr<Drafter> model, std::string name)
        : ngram_(std::move(ngram)), model_(std::move(model)), name_(std::move(name)) {}
    std::string name() const override { return name_; }
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    Draft lookup_draft(const std::vector<Token>& history, int k) override { return ngram_.lookup_draft(history, k); }
    bool has_model() const override { return true; }
    double catch_up_seconds(const std::vector<Token>& history) const override {
        return model_->catch_up_seconds(history);
    }
    Draft model_draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override {
        return model_->draft(history, k, params, rng);
    }
    void select(int slot) override { model_->select(slot); }
    void rollback(const std::vector<Token>& history) override { model_->rollback(history); }
    void prefill(const std::vector<Token>& history) override { model_->prefill(history); }
    std::string head() const override { return model_->head(); }
    DraftKind model_kind() const override { return model_->model_kind(); }

private:
    NgramDrafter ngram_;
    std::unique_ptr<Drafter> model_;
    std::string name_;
};

}  // namespace localspec
