// llama.cpp's C++-only extension functions, looked up at run time on the loaded libllama (MTP's
// hidden states, the context's scheduler), and the layer-input extraction that cross-checks the
// graph tap.
#include "llama/llama_backend.h"

#include <llama.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/errors.h"
#include "llama/impl.h"

namespace localspec {

// ---- llama.cpp's C++-only extensions -------------------------------------------------------

// llama.cpp declares a few functions only in its internal src/llama-ext.h (C++ linkage: mangled
// names). They are looked up at run time on the loaded libllama, so that a libllama without
// them leaves `import localspec` working and only what needs them reports it: MTP drafting
// (the target's and the MTP layers' final hidden states) and the cross-check of the layer tap
// against llama.cpp's own layer-input extraction. LOCALSPEC_HIDE_LLAMA_EXT=1 makes them look
// absent (for tests).
void* libllama_symbol(const char* mangled) {
    const char* hide = std::getenv("LOCALSPEC_HIDE_LLAMA_EXT");
    if (hide && *hide && std::strcmp(hide, "0") != 0) return nullptr;
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&llama_backend_init), &info) || !info.dli_fname) return nullptr;
    void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    return lib ? dlsym(lib, mangled) : nullptr;
}

namespace {

NextnExt nextn_ext() {
    NextnExt ext;
    // void llama_set_embeddings_nextn(llama_context*, bool value, bool masked)
    ext.set = reinterpret_cast<decltype(ext.set)>(libllama_symbol("_Z26llama_set_embeddings_nextnP13llama_contextbb"));
    // float* llama_get_embeddings_nextn(llama_context*)
    ext.get = reinterpret_cast<decltype(ext.get)>(libllama_symbol("_Z26llama_get_embeddings_nextnP13llama_context"));
    // float* llama_get_embeddings_nextn_ith(llama_context*, int32_t)
    ext.get_ith = reinterpret_cast<decltype(ext.get_ith)>(libllama_symbol("_Z30llama_get_embeddings_nextn_ithP13llama_contexti"));
    // void llama_set_nextn_layer_offset(llama_context*, int32_t offset): which NextN layer runs
    ext.set_layer = reinterpret_cast<decltype(ext.set_layer)>(libllama_symbol("_Z28llama_set_nextn_layer_offsetP13llama_contexti"));
    return ext;
}

}  // namespace

NextnExt require_nextn_ext() {
    NextnExt ext = nextn_ext();
    if (!ext.ok()) throw UserError(ErrorKind::InvalidParameter, nextn_extension_missing());
    return ext;
}

std::string nextn_extension_missing() {
    if (nextn_ext().ok()) return "";
    return "this libllama does not export llama_set_embeddings_nextn / llama_get_embeddings_nextn / "
           "llama_set_nextn_layer_offset (llama-cpp-python "
           "0.3.36 does), so MTP layers cannot draft; install that version or use another drafter.";
}

// ---- layer-input extraction ---------------------------------------------------------------

// The layer-input extraction that only some architectures publish (the tap's cross-check).
namespace {

struct LayerInputExt {
    void (*set)(llama_context*, uint32_t, bool) = nullptr;
    float* (*get)(llama_context*, uint32_t) = nullptr;
};

LayerInputExt layer_input_ext() {
    LayerInputExt ext;
    // void llama_set_embeddings_layer_inp(llama_context*, uint32_t, bool)
    ext.set = reinterpret_cast<decltype(ext.set)>(libllama_symbol("_Z30llama_set_embeddings_layer_inpP13llama_contextjb"));
    // float* llama_get_embeddings_layer_inp(llama_context*, uint32_t)
    ext.get = reinterpret_cast<decltype(ext.get)>(libllama_symbol("_Z30llama_get_embeddings_layer_inpP13llama_contextj"));
    if (!ext.set || !ext.get) {
        throw UserError(ErrorKind::InvalidParameter,
                        "this libllama does not export llama_set_embeddings_layer_inp / "
                        "llama_get_embeddings_layer_inp (llama-cpp-python 0.3.36 does); install that version.");
    }
    return ext;
}

}  // namespace

std::vector<float> tapped_layer_inputs(const Model& model, const std::vector<Token>& tokens,
                                       const std::vector<int>& layers) {
    ContextOptions options;
    options.n_ctx = std::max<int>(64, static_cast<int>(tokens.size()) + 1);
    options.tap_layers = layers;
    Context ctx(model, options);
    ctx.decode(tokens, 1);
    std::vector<float> out;
    for (size_t p = 0; p < tokens.size(); ++p) out.insert(out.end(), ctx.features(p), ctx.features(p) + ctx.feature_width());
    return out;
}

std::vector<float> extracted_layer_inputs(const Model& model, const std::vector<Token>& tokens,
                                          const std::vector<int>& layers) {
    const LayerInputExt ext = layer_input_ext();
    ContextOptions options;
    options.n_ctx = std::max<int>(64, static_cast<int>(tokens.size()) + 1);
    Context ctx(model, options);
    for (int il : layers) ext.set(ctx.impl_->ctx, static_cast<uint32_t>(il), true);
    ctx.decode(tokens, 1);
    const size_t n_embd = static_cast<size_t>(model.n_embd());
    std::vector<float> out;
    for (size_t row = 0; row < tokens.size(); ++row) {
        for (int il : layers) {
            const float* data = ext.get(ctx.impl_->ctx, static_cast<uint32_t>(il));
            out.insert(out.end(), data + row * n_embd, data + (row + 1) * n_embd);
        }
    }
    return out;
}

}  // namespace localspec
