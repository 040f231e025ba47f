// Recent outputs (SuffixDecoding's idea, arXiv 2411.04975): assistants repeat themselves across
// requests (the same boilerplate, the same tool calls), so the n-gram drafter also looks up
// continuations in what this engine generated lately, where they match longer than the request's
// own context does.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "llama/llama_backend.h"

namespace localspec {

// Where the continuation after the most recent occurrence of `suffix` (n tokens) in
// tokens[0, size) starts, an occurrence with at least one token after it; -1 when none. Scans
// backwards: the most recent match best predicts the local continuation. (The n-gram drafter's
// lookup over the context and over recent outputs.)
int latest_continuation(const Token* tokens, int size, const Token* suffix, int n);

// The outputs of the latest finished generations, newest first, at most `capacity` tokens in
// all (the oldest outputs are dropped first; an output longer than the capacity keeps its end).
// Owned by the engine thread, like the drafters that read it.
class RecentOutputs {
public:
    explicit RecentOutputs(size_t capacity) : capacity_(capacity) {}
    void add(const std::vector<Token>& output);
    // What followed the most recent stored occurrence of the context's last n tokens (longest n
    // first, from n_max down to n_min), at most k tokens; empty when none. `n_found` gets n.
    std::vector<Token> lookup(const std::vector<Token>& context, int n_min, int n_max, int k, int& n_found) const;
    size_t tokens() const { return tokens_; }

private:
    size_t capacity_;
    size_t tokens_ = 0;
    std::deque<std::vector<Token>> outputs_;  // front: the newest
};

}  // namespace localspec
