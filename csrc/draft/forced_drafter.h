// Grammar-forced drafting (docs/design.md, "Grammar-forced drafting"): where the request's grammar
// admits exactly one continuation for the next characters (a JSON key, punctuation, a fixed
// string of the schema), those characters' tokens are drafted for free, and the next drafter
// continues after them. One more implementation of the drafter interface.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "llama/llama_backend.h"

namespace localspec {

// Finds the text a grammar forces: from a copy of its state, the one-byte tokens of the
// vocabulary are checked in one pass; when exactly one is allowed (and the grammar cannot end
// there), that character is forced, the copy accepts it, and the search goes on.
class ForcedText {
public:
    explicit ForcedText(const Model& model);
    // At most max_chars characters (ASCII: a non-ASCII character ends the search).
    std::string find(const Grammar& grammar, size_t max_chars) const;
    // Where the grammar forces `rest` (non-empty) next: every token it could allow, that is
    // every token whose text (as the grammar reads it) is a prefix of `rest` or starts with
    // it. Empty when there are more than `max` or this vocabulary lacks a one-byte token for
    // some byte (find() could then miss a second allowed character).
    std::vector<Token> candidates(const std::string& rest, size_t max) const;

private:
    std::vector<Token> probe_;  // a few frequent characters: two allowed end the search early
    std::vector<Token> bytes_;  // one token per byte value that has one
    std::vector<char> byte_of_;  // [i]: the byte bytes_[i] renders to
    Token end_ = -1;             // an end-of-generation token: allowed when the grammar may end
    bool every_byte_ = false;    // every byte 1..255 has a one-byte token
    // Every token but end-of-generation ones, by its text as the grammar reads it (sorted).
    std::vector<std::pair<std::string, Token>> by_text_;
};

// Drafts the tokens of the grammar-forced text (the target's own tokenization of it), then lets
// `next` continue after them with its free lookup. Without a grammar, or where nothing is
// forced, it is `next`. A drafter that runs a model does not continue after forced text (a
// hidden-state head needs the target's features at every position before its draft).
class ForcedDrafter : public ChainedDrafter {
public:
    ForcedDrafter(const Model& target, std::unique_ptr<Drafter> next);
    void begin_draft(const DraftInputs& inputs) override;
    Draft draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) override;
    Draft lookup_draft(const std::vector<Token>& history, int k) override;

private:
    // The forced tokens (at most k), with the next drafter's lookup after them.
    Draft forced_then_lookup(const std::vector<Token>& history, int k);
    // Draft::row_candidates of the forced tokens of `text`.
    std::vector<std::vector<Token>> row_candidates(const std::string& text, const std::vector<Token>& forced) const;

    const Model& target_;
    std::unique_ptr<ForcedText> forced_;  // made at the first grammar: it reads the whole vocabulary
    const Grammar* grammar_ = nullptr;  // the current generation's, in its state after the history
};

}  // namespace localspec
