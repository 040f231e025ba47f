// An EAGLE-3 head run by the core on given target features and tokens, the way the drafter runs
// it (csrc/draft/eagle3_drafter.*): for the parity test of the training code's forward pass
// (localspec/train/model.py). Plain C++, no pybind11.
#pragma once

#include <string>
#include <vector>

#include "llama/llama_backend.h"

namespace localspec {

struct HeadProbe {
    int n_rows = 0;
    int n_embd = 0;  // the head's width
    int n_draft = 0;  // draft vocabulary size
    std::vector<float> logits;  // [n_rows x n_draft]: the drafter's draft-vocabulary logits
    std::vector<float> prenorm;  // [n_rows x n_embd]: the state before the final norm
    std::vector<float> normed;  // [n_rows x n_embd]: after it (the logits' input)
    std::vector<Token> d2t;  // draft id -> target id
};

// Rows 0 .. n-2 are the committed entries (tokens[P + 1], fc(features row P)) for
// n = tokens.size(); row n-1+i (i < unroll.size()) is the draft step fed unroll[i] and the
// previous row's pre-norm state. features: n rows of 3 x the target's n_embd floats.
HeadProbe probe_head(const std::string& target_path, const std::string& head_path, const std::vector<Token>& tokens,
                     const std::vector<float>& features, const std::vector<Token>& unroll, bool f32_cache,
                     int n_threads);

}  // namespace localspec
