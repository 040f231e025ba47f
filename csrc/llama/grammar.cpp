// Grammar: a GBNF grammar's state over llama.cpp's grammar sampler (which tokens may come next,
// accepting them one by one).
#include "llama/llama_backend.h"

#include <llama.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/errors.h"
#include "llama/impl.h"

namespace localspec {

struct Grammar::Impl {
    llama_sampler* sampler = nullptr;
    std::vector<llama_token_data> buffer;  // the whole vocabulary, for mask()
    ~Impl() {
        if (sampler) llama_sampler_free(sampler);
    }
};

Grammar::Grammar(const Model& model, const std::string& gbnf) : impl_(std::make_unique<Impl>()) {
    take_last_error();
    impl_->sampler = llama_sampler_init_grammar(model.impl_->vocab, gbnf.c_str(), "root");
    if (!impl_->sampler) {
        std::string reason = take_last_error();
        while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
        throw UserError(ErrorKind::InvalidParameter, "the grammar does not parse" +
                                                         (reason.empty() ? std::string() : " (" + reason + ")") +
                                                         "; check its GBNF syntax (llama.cpp's grammars/README.md).");
    }
}

Grammar::~Grammar() = default;

std::unique_ptr<Grammar> Grammar::clone() const {
    std::unique_ptr<Grammar> out(new Grammar());
    out->impl_ = std::make_unique<Impl>();
    out->impl_->sampler = llama_sampler_clone(impl_->sampler);
    return out;
}

bool Grammar::allows(Token token) const {
    llama_token_data one{token, 0.0f, 0.0f};
    llama_token_data_array array{&one, 1, -1, false};
    apply(array);
    return one.logit != -INFINITY;
}

std::vector<Token> Grammar::allowed(const std::vector<Token>& candidates) const {
    auto& buffer = impl_->buffer;
    buffer.resize(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) buffer[i] = {candidates[i], 0.0f, 0.0f};
    llama_token_data_array array{buffer.data(), buffer.size(), -1, false};
    apply(array);
    std::vector<Token> out;
    for (size_t i = 0; i < array.size; ++i) {
        if (array.data[i].logit != -INFINITY) out.push_back(array.data[i].id);
    }
    return out;
}

// A grammar that allows no token at all here matches nothing from this point: sampling from an
// all -infinity row would emit an arbitrary token, so the generation stops with a sentence
// instead (a grammar that matched nothing used to answer with replacement characters).
void Grammar::mask(float* logits, int n_vocab) {
    auto& buffer = impl_->buffer;
    buffer.resize(static_cast<size_t>(n_vocab));
    for (int i = 0; i < n_vocab; ++i) buffer[static_cast<size_t>(i)] = {i, 0.0f, 0.0f};
    llama_token_data_array array{buffer.data(), buffer.size(), -1, false};
    apply(array);
    bool any = false;
    for (size_t i = 0; i < array.size; ++i) {
        if (array.data[i].logit == -INFINITY) {
            logits[array.data[i].id] = -INFINITY;
        } else {
            any = true;
        }
    }
    if (!any) {
        throw UserError(ErrorKind::InvalidParameter,
                        "the grammar allows no token at this point, so no text can match it; "
                        "check that its rules can be completed by the model's tokens.");
    }
}

// llama.cpp's grammar sampler throws std::runtime_error when its state cannot take a token
// (e.g. "Unexpected empty grammar stack"): that is the request's grammar failing, not the core.
void Grammar::apply(llama_token_data_array& array) const {
    try {
        llama_sampler_apply(impl_->sampler, &array);
    } catch (const std::exception& e) {
        throw UserError(ErrorKind::InvalidParameter, std::string("the grammar failed: ") + e.what());
    }
}

double Grammar::first_mask_seconds(int n_vocab) {
    std::vector<float> logits(static_cast<size_t>(n_vocab), 0.0f);
    const auto t0 = Clock::now();
    std::unique_ptr<Grammar> first = clone();
    first->mask(logits.data(), n_vocab);
    return seconds_since(t0);
}

void Grammar::accept(Token token) {
    try {
        llama_sampler_accept(impl_->sampler, token);
    } catch (const std::exception& e) {
        throw UserError(ErrorKind::InvalidParameter,
                        std::string("the grammar cannot go on after the model's token: ") + e.what());
    }
}

}  // namespace localspec
