// Incremental detokenization for streaming: turns token pieces into text deltas that are
// always valid UTF-8 and never contain (or end in a possible start of) a stop string.
#pragma once

#include <string>
#include <vector>

namespace localspec {

class TextStream {
public:
    explicit TextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {}

    // Add the bytes of newly emitted tokens; returns the text that is now safe to show.
    std::string push(const std::string& piece_bytes);
    // Generation ended: return whatever is still held back (minus any partial UTF-8).
    std::string flush();
    bool stopped() const { return stopped_; }  // a stop string was found; text ends before it
    const std::string& text() const { return emitted_; }

private:
    std::vector<std::string> stop_;
    std::string pending_bytes_;  // an incomplete UTF-8 sequence at the end
    std::string text_;           // decoded text not yet emitted
    std::string emitted_;
    bool stopped_ = false;

    std::string take(size_t n);
};

}  // namespace localspec
