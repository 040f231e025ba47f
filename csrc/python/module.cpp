// The extension module's entry point (PYBIND11_MODULE): the exception translation, then each
// part's registration (bindings.h).
#include <exception>

#include "base/errors.h"
#include "engine/engine.h"
#include "python/bindings.h"

using namespace localspec;

namespace {

void translate_user_error(const UserError& e) {
    static const char* names[] = {"ModelLoadError", "VocabMismatchError", "PromptTooLongError",
                                  "InvalidParameterError", "RemoteWorkerError", "RpcUnavailableError"};
    py::object cls = py::module_::import("localspec.errors").attr(names[static_cast<int>(e.kind)]);
    PyErr_SetString(cls.ptr(), e.what());
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "localspec C++ core: speculative decoding over llama.cpp";
    m.attr("AUTO_DRAFT_MAX") = kAutoDraftMax;
    m.attr("ROLLBACK_DEPTH") = kRollbackDepth;

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const UserError& e) {
            translate_user_error(e);
        }
    });

    register_types(m);
    register_core(m);
    register_testing(m);
    register_functions(m);
}
