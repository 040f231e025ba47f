// Whether a draft model can propose tokens for a target: a check on the two vocabularies,
// through Model's accessors only (no llama.h here).
#pragma once

#include <string>

#include "llama/llama_backend.h"

namespace localspec {

struct VocabComparison {
    VocabInfo target, draft;
    int first_difference = -1;  // first token id whose text differs; -1 if none
    std::string target_text, draft_text;  // the texts at first_difference
    std::string problem;  // "" when the draft can draft for the target
};

// Can `draft` propose tokens for `target`? Same vocabulary type, the same text for every
// common token, same BOS/EOS; sizes may differ by a little padding (as between Qwen sizes).
VocabComparison compare_vocab(const Model& target, const Model& draft);
// Throws UserError(VocabMismatch) naming the problem when compare_vocab finds one.
void check_vocab_compatible(const Model& target, const Model& draft);

}  // namespace localspec
