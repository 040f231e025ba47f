// The hidden states a target context records for one sequence, a row per cached position
// (Context::features): what hidden-state drafters read. Plain C++, no llama.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace localspec {

// Rows for positions begin() .. end() - 1, `width` floats each; the positions before begin()
// were dropped (a reader no longer needed them) or never recorded.
class FeatureLog {
public:
    size_t begin() const { return begin_; }
    size_t end(size_t width) const { return begin_ + (width ? rows_.size() / width : 0); }
    const float* row(size_t pos, size_t width) const { return rows_.data() + (pos - begin_) * width; }

    // Rows of the positions that follow end().
    void append(const float* rows, size_t n_rows, size_t width) {
        rows_.insert(rows_.end(), rows, rows + n_rows * width);
    }
    // Nothing recorded; the next rows belong to positions from `pos` on.
    void restart(size_t pos) {
        rows_.clear();
        begin_ = pos;
    }
    // Keep positions < n_keep (the cache dropped the others).
    void truncate(size_t n_keep, size_t width) {
        begin_ = std::min(begin_, n_keep);
        rows_.resize(std::min(rows_.size(), (n_keep - begin_) * width));
    }
    void drop_before(size_t pos, size_t width) {
        pos = std::min(pos, end(width));
        if (pos <= begin_) return;
        rows_.erase(rows_.begin(), rows_.begin() + static_cast<long>((pos - begin_) * width));
        begin_ = pos;
    }

private:
    size_t begin_ = 0;
    std::vector<float> rows_;
};

}  // namespace localspec
