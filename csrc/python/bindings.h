// What the binding's files (csrc/python/, the only folder that includes pybind11) share: the
// register functions module.cpp calls, and the converters and GIL helper several of them use.
// The binding converts types and releases the GIL around model work; it holds no logic.
#pragma once

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "kernels/head_common.h"

namespace py = pybind11;

namespace localspec {

// Computes on the calling Python thread without the GIL. Afterwards that thread's OpenMP
// workers are ended (release_compute_threads): kept, they would count against every engine's
// spinning barriers for as long as the thread lives, and each pass would sleep and wake its
// workers instead (the main thread of the test suite, after one head test: sampling tests 4-6x
// slower). Engine threads release theirs when idle (engine_loop.py).
struct ComputeOnCaller {
    py::gil_scoped_release release;
    ~ComputeOnCaller() { release_compute_threads(); }
};

inline py::bytes to_bytes(const std::string& s) { return py::bytes(s); }

// Text from the model can end mid-character only in token_piece; decode leniently there.
inline py::str to_str(const std::string& s) { return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace")); }

// The module's parts, registered in this order by PYBIND11_MODULE (module.cpp).
void register_types(py::module_& m);      // plain structs: options, requests, stats (types.cpp)
void register_core(py::module_& m);       // Core, the engine (core.cpp)
void register_testing(py::module_& m);    // the _core.testing submodule (testing.cpp)
void register_functions(py::module_& m);  // functions without an engine (functions.cpp)

}  // namespace localspec
