#include "engine/text_stream.h"

#include <algorithm>

namespace localspec {

namespace {

// Length of the longest prefix of `bytes` that ends on a UTF-8 character boundary.
size_t complete_utf8_prefix(const std::string& bytes) {
    const size_t n = bytes.size();
    for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
        const auto c = static_cast<unsigned char>(bytes[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
        size_t need = 1;
        if ((c & 0xE0) == 0xC0) need = 2;
        else if ((c & 0xF0) == 0xE0) need = 3;
        else if ((c & 0xF8) == 0xF0) need = 4;
        return back >= need ? n : n - back;
    }
    return n;  // only continuation bytes: pass them through rather than stall
}

}  // namespace

std::string TextStream::take(size_t n) {
    std::string out = text_.substr(0, n);
    text_.erase(0, n);
    emitted_ += out;
    return out;
}

std::string TextStream::push(const std::string& piece_bytes) {
    if (stopped_) return "";
    pending_bytes_ += piece_bytes;
    const size_t complete = complete_utf8_prefix(pending_bytes_);
    text_ += pending_bytes_.substr(0, complete);
    pending_bytes_.erase(0, complete);

    // A stop string may straddle what was already emitted only if we emitted a prefix of it,
    // which the hold-back below prevents; so searching text_ alone is enough.
    size_t first_stop = std::string::npos;
    for (const std::string& s : stop_) first_stop = std::min(first_stop, text_.find(s));
    if (first_stop != std::string::npos) {
        stopped_ = true;
        std::string out = take(first_stop);
        text_.clear();
        return out;
    }
    // Hold back the longest suffix of text_ that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const std::string& s : stop_) {
        for (size_t len = std::min(s.size() - 1, text_.size()); len > hold; --len) {
            if (text_.compare(text_.size() - len, len, s, 0, len) == 0) {
                hold = len;
                break;
            }
        }
    }
    return take(text_.size() - hold);
}

std::string TextStream::flush() {
    if (stopped_) return "";
    return take(text_.size());
}

}  // namespace localspec
