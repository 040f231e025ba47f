#include "draft/vocab_check.h"

#include <algorithm>
#include <cstdlib>

#include "base/errors.h"

namespace localspec {

VocabComparison compare_vocab(const Model& target, const Model& draft) {
    constexpr int kMaxSizeDifference = 128;
    VocabComparison out;
    out.target = target.vocab();
    out.draft = draft.vocab();
    const int common = std::min(out.target.n_tokens, out.draft.n_tokens);
    for (int id = 0; id < common; ++id) {
        std::string tt = target.token_text(id), dt = draft.token_text(id);
        if (tt != dt) {
            out.first_difference = id;
            out.target_text = std::move(tt);
            out.draft_text = std::move(dt);
            break;
        }
    }
    if (out.first_difference >= 0) {
        out.problem = "token " + std::to_string(out.first_difference) + " is '" + out.target_text +
                      "' in the target but '" + out.draft_text + "' in the draft";
    } else if (out.target.type != out.draft.type) {
        out.problem = "their tokenizer types differ";
    } else if (std::abs(out.target.n_tokens - out.draft.n_tokens) > kMaxSizeDifference) {
        out.problem = "the target has " + std::to_string(out.target.n_tokens) + " tokens and the draft " +
                      std::to_string(out.draft.n_tokens);
    } else if (out.target.bos != out.draft.bos || out.target.eos != out.draft.eos) {
        out.problem = "their BOS/EOS tokens differ";
    }
    return out;
}

void check_vocab_compatible(const Model& target, const Model& draft) {
    const VocabComparison cmp = compare_vocab(target, draft);
    if (!cmp.problem.empty()) {
        throw UserError(ErrorKind::VocabMismatch, "the draft '" + draft.path() + "' cannot draft for the target '" +
                                                      target.path() + "': " + cmp.problem +
                                                      "; use a draft from the same model family, or --draft ngram.");
    }
}

}  // namespace localspec
