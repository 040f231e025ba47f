// Copies named nodes of llama.cpp's compute graph while it runs (the eval callback sees every
// node by name). EAGLE-3 heads read the target's hidden states at three layers; not every
// architecture publishes them through llama.cpp's API (Gemma 3 does not), but every one names
// each layer's output "l_out-<il>", which is the next layer's input. Includes ggml's headers,
// never llama.h.
#pragma once

#include <string>
#include <vector>

struct ggml_tensor;

namespace localspec {

class GraphTap {
public:
    GraphTap() = default;
    explicit GraphTap(std::vector<std::string> names) : names_(std::move(names)), rows_(names_.size()) {}

    bool empty() const { return names_.empty(); }
    size_t size() const { return names_.size(); }
    // Whether the graph must stop after `t` so that capture(t) can read it.
    bool wants(const ggml_tensor* t) const;
    // Append t's rows (F32, [ne0 x ne1]) to the rows of its name; from any backend's memory.
    void capture(const ggml_tensor* t);
    // Forget what the previous decode captured (a decode may run several graphs: rows append).
    void clear();
    // Captured rows of names[i], row-major, each `width(i)` floats.
    const std::vector<float>& rows(size_t i) const { return rows_[i]; }
    int width(size_t i) const { return widths_.empty() ? 0 : widths_[i]; }
    int n_rows(size_t i) const { return width(i) > 0 ? static_cast<int>(rows_[i].size() / static_cast<size_t>(width(i))) : 0; }

private:
    int index(const ggml_tensor* t) const;

    std::vector<std::string> names_;
    std::vector<std::vector<float>> rows_;
    std::vector<int> widths_;
};

// The graph node whose output is the input of layer `il` of a decoder-only model: the previous
// layer's output ("l_out-<il-1>"). Layer 0's input (the scaled embeddings) has no common name.
std::string layer_input_name(int il);

}  // namespace localspec
