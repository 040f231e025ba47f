// Quantizing a GGUF with llama.cpp's quantize API (quantize_model).
#include "llama/llama_backend.h"

#include <llama.h>

#include <string>
#include <utility>

#include "base/errors.h"
#include "llama/impl.h"

namespace localspec {

void quantize_model(const std::string& in_path, const std::string& out_path,
                    const std::string& type, int n_threads) {
    static const std::pair<const char*, llama_ftype> kTypes[] = {
        {"F32", LLAMA_FTYPE_ALL_F32},      {"F16", LLAMA_FTYPE_MOSTLY_F16},
        {"BF16", LLAMA_FTYPE_MOSTLY_BF16}, {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
        {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K}, {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M},
        {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"Q4_K_S", LLAMA_FTYPE_MOSTLY_Q4_K_S},
        {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0}, {"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0}, {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M},
        {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},
    };
    const llama_ftype* ftype = nullptr;
    std::string names;
    for (const auto& [name, value] : kTypes) {
        if (type == name) ftype = &value;
        names += names.empty() ? name : std::string(", ") + name;
    }
    if (!ftype) {
        throw UserError(ErrorKind::InvalidParameter,
                        "unknown quantization type '" + type + "'; use one of " + names + ".");
    }
    check_gguf_file(in_path);
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.ftype = *ftype;
    params.nthread = n_threads;
    params.allow_requantize = true;
    take_last_error();
    if (llama_model_quantize(in_path.c_str(), out_path.c_str(), &params) != 0) {
        throw UserError(ErrorKind::ModelLoad, "could not quantize '" + in_path + "': " + take_last_error());
    }
}

}  // namespace localspec
