// The engine's measuring tools: start-up calibration of pass costs, raw logits, pass timings and
// the greedy replay. They use a cache slot no generation holds.
#include <algorithm>
#include <stdexcept>

#include "base/clock.h"
#include "engine/engine.h"
#include "engine/sequence.h"
#include "sample/target_rows.h"

namespace localspec {

int SpecEngine::free_slot() const {
    for (int slot = 0; slot < n_seq(); ++slot) {
        if (!slot_busy(slot)) return slot;
    }
    throw std::logic_error("every generation slot is busy; measure when no generation runs");
}

// Once per engine (unless restored memory already has them): time a pass over every row count
// the controller may choose, so that its worst-case bound uses measured costs from the first
// step. The context is the prompt (repeated if short), so the prefill that follows reuses it.
// Interference from other processes only ever adds time, and more rows never cost less: each
// row count keeps its fastest of three passes, and no count is cheaper than a smaller one (a
// preempted 1-row pass would otherwise make drafting look free).
void SpecEngine::calibrate(const std::vector<Token>& prompt, int slot) {
    const int rows = controller_.k_max() + 1;
    const auto& verify = controller_.memory().verify;
    if (verify.back() > 0) {
        if (pass_cost_.empty()) {  // restored memory: the batch curve starts from it
            for (int r = 1; r <= rows; ++r) pass_cost_.observe(r, controller_.verify_seconds(r));
        }
        return;
    }
    std::vector<Token> context;
    while (static_cast<int>(context.size()) < rows + 1) context.insert(context.end(), prompt.begin(), prompt.end());
    if (static_cast<int>(context.size()) >= n_ctx()) return;
    std::vector<double> fastest = pass_seconds_on(slot, context, rows, 1);
    for (int repeat = 1; repeat < 3; ++repeat) {
        const std::vector<double> seconds = pass_seconds_on(slot, context, rows, 1);
        for (size_t r = 1; r < fastest.size(); ++r) fastest[r] = std::min(fastest[r], seconds[r]);
    }
    for (size_t r = 2; r < fastest.size(); ++r) fastest[r] = std::max(fastest[r], fastest[r - 1]);
    for (int r = 1; r <= rows; ++r) {
        controller_.seed_verify_seconds(r, fastest[static_cast<size_t>(r)]);
        pass_cost_.observe(r, fastest[static_cast<size_t>(r)]);
    }
    if (n_seq() > 1) calibrate_batch(context, slot);
}

void SpecEngine::warm_up(const std::vector<Token>& context) {
    if (!drafter_ || !sequences_.empty() || context.empty()) return;
    const int slot = free_slot();
    if (n_seq() == 1) target_.set_tapping(true);  // as for a drafting request's passes
    calibrate(context, slot);
    clear_slot(slot);  // no request shares the warm-up's text
}

// Passes of as many rows as a full batch may hold (every generation drafting k_max), at a few
// row counts between: fastest of two each.
void SpecEngine::calibrate_batch(const std::vector<Token>& prompt, int slot) {
    const int k_rows = controller_.k_max() + 1;
    const int max_rows = std::min(n_seq() * k_rows, n_ctx() - 1);
    std::vector<Token> context;
    while (static_cast<int>(context.size()) < max_rows + 1) context.insert(context.end(), prompt.begin(), prompt.end());
    if (static_cast<int>(context.size()) >= n_ctx()) return;
    for (int rows = 2 * k_rows; rows <= max_rows; rows += std::max(k_rows, rows / 2)) {
        const auto split = context.end() - rows;
        double best = 0;
        for (int repeat = 0; repeat < 2; ++repeat) {
            target_.sync(std::vector<Token>(context.begin(), split), 0, slot);
            const auto t0 = Clock::now();
            target_.decode(std::vector<Token>(split, context.end()), rows, slot);
            const double seconds = seconds_since(t0);
            best = repeat == 0 ? seconds : std::min(best, seconds);
        }
        pass_cost_.observe(rows, std::max(best, pass_cost_.seconds(rows - 1)));
    }
}

std::vector<float> SpecEngine::next_token_logits(const std::vector<Token>& tokens, int batch_rows) {
    GenerateRequest probe;
    probe.prompt = tokens;
    check_request(probe);
    const size_t rows = static_cast<size_t>(std::clamp(batch_rows, 1, static_cast<int>(tokens.size())));
    const std::vector<Token> head(tokens.begin(), tokens.end() - static_cast<long>(rows));
    const int slot = free_slot();
    target_.sync(head, 0, slot);
    target_.decode(std::vector<Token>(tokens.end() - static_cast<long>(rows), tokens.end()), static_cast<int>(rows),
                   slot);
    const float* row = target_.logits(static_cast<int>(rows) - 1);
    return std::vector<float>(row, row + target_.n_vocab());
}

std::vector<float> SpecEngine::pass_logits(const std::vector<Token>& tokens, int rows) {
    GenerateRequest probe;
    probe.prompt = tokens;
    check_request(probe);
    const size_t n = static_cast<size_t>(std::clamp(rows, 1, static_cast<int>(tokens.size())));
    const int slot = free_slot();
    target_.sync(std::vector<Token>(tokens.begin(), tokens.end() - static_cast<long>(n)), 0, slot);
    target_.decode(std::vector<Token>(tokens.end() - static_cast<long>(n), tokens.end()), static_cast<int>(n), slot);
    const size_t n_vocab = static_cast<size_t>(target_.n_vocab());
    std::vector<float> out(n * n_vocab);
    for (size_t r = 0; r < n; ++r) {
        const float* row = target_.logits(static_cast<int>(r));
        std::copy(row, row + n_vocab, out.begin() + static_cast<long>(r * n_vocab));
    }
    return out;
}

std::vector<double> SpecEngine::pass_seconds(const std::vector<Token>& context, int max_rows, int repeats) {
    return pass_seconds_on(free_slot(), context, max_rows, repeats);
}

std::vector<double> SpecEngine::pass_seconds_on(int slot, const std::vector<Token>& context, int max_rows,
                                                int repeats) {
    GenerateRequest probe;
    probe.prompt = context;
    check_request(probe);
    if (max_rows < 1 || max_rows >= static_cast<int>(context.size()) || repeats < 1) {
        throw std::invalid_argument("pass_seconds needs 1 <= max_rows < the context's length and repeats >= 1");
    }
    std::vector<std::vector<double>> samples(static_cast<size_t>(max_rows) + 1);
    for (int repeat = 0; repeat < repeats; ++repeat) {
        for (int rows = 1; rows <= max_rows; ++rows) {
            const auto split = context.end() - rows;
            target_.sync(std::vector<Token>(context.begin(), split), 0, slot);
            const auto t0 = Clock::now();
            target_.decode(std::vector<Token>(split, context.end()), rows, slot);
            for (int i = 0; i < rows; ++i) argmax(target_.logits(i), target_.n_vocab());
            samples[static_cast<size_t>(rows)].push_back(seconds_since(t0));
        }
    }
    std::vector<double> medians(samples.size(), 0.0);
    for (size_t rows = 1; rows < samples.size(); ++rows) {
        auto& s = samples[rows];
        std::nth_element(s.begin(), s.begin() + static_cast<long>(s.size() / 2), s.end());
        medians[rows] = s[s.size() / 2];
    }
    return medians;
}

ReplayOutcome SpecEngine::replay_greedy(const std::vector<Token>& prompt, const std::vector<Token>& tokens,
                              const std::vector<int>& pass_rows, const std::vector<int>& pass_emitted,
                              const GenerateRequest& shaping) {
    std::unique_ptr<Grammar> grammar;
    if (!shaping.grammar.empty()) grammar = std::make_unique<Grammar>(*target_model_, shaping.grammar);
    GenerateRequest probe;
    probe.prompt = prompt;
    check_request(probe);
    const int slot = free_slot();
    target_.truncate(0, slot);
    std::vector<Token> history = prompt;
    target_.decode(std::vector<Token>(history.begin(), history.end() - 1), 0, slot);
    size_t next = 0;  // index of the next emitted token to check
    ReplayOutcome outcome;  // goes on past a mismatch: the same passes to the end (bench timing)
    for (size_t pass = 0; pass < pass_rows.size() && next < tokens.size(); ++pass) {
        // [last, the tokens this pass emitted, filler up to the pass's rows]: rows after the
        // checked ones cannot influence them (causal attention), they only give the same shape.
        const int rows = pass_rows[pass];
        std::vector<Token> batch{history.back()};
        for (int i = 1; i < rows; ++i) {
            const size_t idx = next + static_cast<size_t>(i) - 1;
            batch.push_back(idx < tokens.size() ? tokens[idx] : history.back());
        }
        const size_t kept = history.size() - 1;
        target_.decode(batch, rows, slot);
        ++outcome.passes;
        const int n = std::min(pass_emitted[pass], rows);
        const std::vector<Token> drafted(batch.begin() + 1, batch.end());
        TargetRows shaped(target_, 0, history, drafted, shaping.sampling, grammar.get());  // as the step shapes them
        for (int i = 0; i < n && next < tokens.size(); ++i, ++next) {
            if (outcome.first_mismatch < 0 && shaped.argmax(static_cast<size_t>(i)) != tokens[next]) {
                outcome.first_mismatch = static_cast<int>(next);
            }
            history.push_back(tokens[next]);
        }
        if (n > 0) shaped.emit(history.back());
        target_.truncate(kept + static_cast<size_t>(n), slot);
    }
    return outcome;
}

}  // namespace localspec
