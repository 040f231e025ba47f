#include "draft/forced_drafter.h"

#include <algorithm>

namespace localspec {

namespace {

// Checked first: where two of these are allowed (inside a string, a number), nothing is forced.
constexpr char kProbe[] = " e\"a0t,1}";
// Characters searched per drafted token (a token is ~4 characters of JSON), and at most.
constexpr size_t kCharsPerToken = 8;
constexpr size_t kMaxChars = 96;
// A row with more candidates than this gets its whole logits row.
constexpr size_t kMaxCandidates = 512;

}  // namespace

ForcedText::ForcedText(const Model& model) : end_(model.vocab().eos) {
    std::vector<Token> of_byte(256, -1);
    const int n = model.vocab().n_tokens;
    for (Token t = 0; t < n; ++t) {
        if (model.is_end_of_generation(t)) continue;
        std::string text = model.token_piece(t, true);  // llama.cpp's grammar reads this
        if (!text.empty() && text[0] != 0) by_text_.emplace_back(std::move(text), t);
        const std::string piece = model.token_piece(t);
        if (piece.size() != 1) continue;
        const auto byte = static_cast<unsigned char>(piece[0]);
        if (byte > 0 && of_byte[byte] < 0) of_byte[byte] = t;
    }
    std::sort(by_text_.begin(), by_text_.end());
    every_byte_ = std::all_of(of_byte.begin() + 1, of_byte.end(), [](Token t) { return t >= 0; });
    for (int b = 1; b < 256; ++b) {
        if (of_byte[static_cast<size_t>(b)] < 0) continue;
        bytes_.push_back(of_byte[static_cast<size_t>(b)]);
        byte_of_.push_back(static_cast<char>(b));
    }
    for (const char* c = kProbe; *c; ++c) {
        const Token t = of_byte[static_cast<unsigned char>(*c)];
        if (t >= 0) probe_.push_back(t);
    }
}

// A character is forced when exactly one one-byte token is allowed and the grammar cannot end
// there. The first byte of every UTF-8 character has a one-byte token in byte-level and
// byte-fallback vocabularies, and the grammar allows a token holding only a character's first
// byte when it allows the character, so one allowed byte means one allowed character. A
// non-ASCII one ends the search (its tokens are not drafted).
std::string ForcedText::find(const Grammar& grammar, size_t max_chars) const {
    std::string text;
    std::unique_ptr<Grammar> state;
    while (text.size() < max_chars) {
        const Grammar& now = state ? *state : grammar;
        if (now.allowed(probe_).size() > 1) break;
        if (end_ >= 0 && now.allows(end_)) break;
        const std::vector<Token> allowed = now.allowed(bytes_);
        if (allowed.size() != 1) break;
        const auto at = static_cast<size_t>(std::find(bytes_.begin(), bytes_.end(), allowed[0]) - bytes_.begin());
        if (static_cast<unsigned char>(byte_of_[at]) >= 0x80) break;
        if (!state) state = grammar.clone();
        text += byte_of_[at];
        state->accept(allowed[0]);
    }
    return text;
}

// A token the grammar allows where it forces `rest` must match `rest` byte by byte for as long
// as both last (one allowed byte per position, find()), so its text is a prefix of `rest` or
// starts with it. The prefixes are looked up one length at a time, the longer ones as the range
// of texts that start with `rest`.
std::vector<Token> ForcedText::candidates(const std::string& rest, size_t max) const {
    std::vector<Token> out;
    if (!every_byte_ || rest.empty()) return out;
    const auto text_less = [](const std::pair<std::string, Token>& e, const std::string& s) { return e.first < s; };
    for (size_t len = 1; len < rest.size(); ++len) {
        const std::string prefix = rest.substr(0, len);
        for (auto it = std::lower_bound(by_text_.begin(), by_text_.end(), prefix, text_less);
             it != by_text_.end() && it->first == prefix; ++it) {
            out.push_back(it->second);
        }
    }
    for (auto it = std::lower_bound(by_text_.begin(), by_text_.end(), rest, text_less);
         it != by_text_.end() && it->first.compare(0, rest.size(), rest) == 0; ++it) {
        if (out.size() >= max) return {};
        out.push_back(it->second);
    }
    return out.size() <= max ? out : std::vector<Token>{};
}

ForcedDrafter::ForcedDrafter(const Model& target, std::unique_ptr<Drafter> next)
    : ChainedDrafter(std::move(next)), target_(target) {}

void ForcedDrafter::begin_draft(const DraftInputs& inputs) {
    grammar_ = inputs.grammar;
    if (grammar_ && !forced_) forced_ = std::make_unique<ForcedText>(target_);
    next_->begin_draft(inputs);
}

Draft ForcedDrafter::forced_then_lookup(const std::vector<Token>& history, int k) {
    Draft out;
    if (!grammar_ || !forced_ || k <= 0) return out;
    const std::string text = forced_->find(*grammar_, std::min(kMaxChars, kCharsPerToken * static_cast<size_t>(k)));
    if (text.empty()) return out;
    // Special tokens' text as the special tokens (a tool call's "<tool_call>" is one token to
    // Qwen, and the grammar reads control tokens as their text).
    out.tokens = target_.tokenize(text, false, true);
    if (out.tokens.size() > static_cast<size_t>(k)) out.tokens.resize(static_cast<size_t>(k));
    out.forced = static_cast<int>(out.tokens.size());
    out.kind = DraftKind::forced();
    out.row_candidates = row_candidates(text, out.tokens);
    const int rest = k - out.forced;
    if (rest <= 0) return out;
    std::vector<Token> context = history;
    context.insert(context.end(), out.tokens.begin(), out.tokens.end());
    Draft tail = next_->lookup_draft(context, rest);
    if (tail.tokens.empty()) return out;
    out.tokens.insert(out.tokens.end(), tail.tokens.begin(), tail.tokens.end());
    out.kind = tail.kind;
    return out;
}

// Row i follows d_1..d_i, whose texts spell the start of the forced text; the rest of it is
// what the grammar forces there.
std::vector<std::vector<Token>> ForcedDrafter::row_candidates(const std::string& text,
                                                              const std::vector<Token>& forced) const {
    std::vector<std::vector<Token>> rows;
    size_t at = 0;
    for (size_t i = 0; i <= forced.size() && at < text.size(); ++i) {
        std::vector<Token> c = forced_->candidates(text.substr(at), kMaxCandidates);
        if (c.empty()) break;
        rows.push_back(std::move(c));
        if (i == forced.size()) break;
        const std::string piece = target_.token_piece(forced[i], true);
        if (text.compare(at, piece.size(), piece) != 0) break;  // a tokenizer that adds text
        at += piece.size();
    }
    return rows;
}

Draft ForcedDrafter::draft(const std::vector<Token>& history, int k, const SamplingParams& params, Rng& rng) {
    Draft out = forced_then_lookup(history, k);
    return out.tokens.empty() ? next_->draft(history, k, params, rng) : out;
}

Draft ForcedDrafter::lookup_draft(const std::vector<Token>& history, int k) {
    Draft out = forced_then_lookup(history, k);
    return out.tokens.empty() ? next_->lookup_draft(history, k) : out;
}

}  // namespace localspec
