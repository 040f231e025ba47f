// The kinds of draft (docs/design.md, "The controller"): who proposed the tokens, which tells the
// controller whose acceptance and cost to learn from them.
#pragma once

namespace localspec {

// What kind of draft a proposal is. The controller learns acceptance and cost per kind
// (DraftKind::slot), and the statistics count drafted and accepted tokens per source.
struct DraftKind {
    // A new source is one more entry here and its name in source_name (the name labels the
    // statistics and the server's /metrics).
    enum class Source {
        Model,   // a draft model: a pass of its own per drafted token
        Head,    // a hidden-state head reading the target's features (EAGLE-3)
        Lookup,  // an n-gram lookup over the context: free to propose
        Mtp,     // the target's own MTP (NextN) layers reading its final hidden states
        Forced,  // text the request's grammar forces (forced_drafter.h): free to propose
        Prediction,  // the request's own prediction of its output (prediction_drafter.h): free
    };
    static constexpr int kSources = 6;
    static const char* source_name(Source s) {
        switch (s) {
            case Source::Model: return "model";
            case Source::Head: return "eagle3";
            case Source::Lookup: return "ngram";
            case Source::Mtp: return "mtp";
            case Source::Forced: return "forced";
            case Source::Prediction: return "prediction";
        }
        return "?";
    }
    Source source = Source::Model;
    int match_length = 0;  // Lookup: how many context tokens matched (a longer match predicts better)

    static constexpr int kMaxMatchLength = 7;
    static constexpr int kForcedSlot = kMaxMatchLength + 1;
    static constexpr int kPredictionSlot = kForcedSlot + 1;
    // slot 0: model, head or MTP; 1..7: lookups; 8: forced; 9: prediction
    static constexpr int kSlots = kPredictionSlot + 1;
    static DraftKind model() { return {Source::Model, 0}; }
    static DraftKind head() { return {Source::Head, 0}; }
    static DraftKind lookup(int match_length) { return {Source::Lookup, match_length}; }
    static DraftKind forced() { return {Source::Forced, 0}; }
    static DraftKind mtp() { return {Source::Mtp, 0}; }
    static DraftKind prediction() { return {Source::Prediction, 0}; }

    // The controller's index for this kind. A drafter runs at most one model, head or MTP
    // layers, so they share slot 0; lookups learn per match length, longer matches pooled at the longest.
    int slot() const {
        if (source == Source::Forced) return kForcedSlot;
        if (source == Source::Prediction) return kPredictionSlot;
        if (source != Source::Lookup) return 0;
        return match_length < 1 ? 1 : (match_length > kMaxMatchLength ? kMaxMatchLength : match_length);
    }
    bool runs_model() const {
        return source != Source::Lookup && source != Source::Forced && source != Source::Prediction;
    }
};

}  // namespace localspec
