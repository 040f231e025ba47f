#include "llama/graph_tap.h"

#include <ggml-backend.h>
#include <ggml.h>

#include <cstring>
#include <stdexcept>

namespace localspec {

int GraphTap::index(const ggml_tensor* t) const {
    for (size_t i = 0; i < names_.size(); ++i) {
        if (std::strcmp(t->name, names_[i].c_str()) == 0) return static_cast<int>(i);
    }
    return -1;
}

bool GraphTap::wants(const ggml_tensor* t) const { return !names_.empty() && index(t) >= 0; }

void GraphTap::capture(const ggml_tensor* t) {
    if (index(t) < 0) return;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        throw std::runtime_error(std::string("graph node ") + t->name + " is not a contiguous F32 tensor");
    }
    if (widths_.empty()) widths_.assign(names_.size(), 0);
    for (size_t i = 0; i < names_.size(); ++i) {  // a name may be listed twice (a head reading a layer twice)
        if (names_[i] != t->name) continue;
        widths_[i] = static_cast<int>(t->ne[0]);
        auto& out = rows_[i];
        const size_t old = out.size();
        out.resize(old + static_cast<size_t>(ggml_nelements(t)));
        ggml_backend_tensor_get(t, out.data() + old, 0, ggml_nbytes(t));
    }
}

void GraphTap::clear() {
    for (auto& r : rows_) r.clear();
}

std::string layer_input_name(int il) {
    if (il < 1) throw std::invalid_argument("layer 0's input is not tapped");
    return "l_out-" + std::to_string(il - 1);
}

}  // namespace localspec
