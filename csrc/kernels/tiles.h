// localspec's int8 tile kernels, per weight format: the arguments a kernel takes (its Job) and
// the function that returns the format's kernels (HeadKernels, one per instruction set).
//
// The one place that picks an architecture's kernels, as ggml-cpu's arch-fallback.h does for
// ggml's: x86-64 (GCC or Clang) has them, in csrc/kernels/x86/ (AVX2, AVX-VNNI, AVX512-VNNI);
// every other build gets the generic fallback below, empty tables, so the heads and the body
// matmuls report themselves unsupported (int8_kernels_supported(), q4k_matmul_supported()) and
// llama.cpp's own kernels do the products. Another architecture adds its folder and its branch
// here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/head_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOCALSPEC_X86 1
#endif

namespace localspec {

struct QuantizedRows;  // int8_rows.h: activations as Q8_0
struct Q8KRows;  // int8_rows.h: activations as Q8_K

// Q8_0 weights as q8_head.cpp packs them, times activations as Q8_0.
struct Q8Job {
    const uint8_t* weights;
    const uint16_t* scales;
    int n_blocks;
    bool small;  // every weight within [-16, 15]
    const QuantizedRows* q;
    int64_t n_vocab;
    float* logits;
};

// Q6_K weights as q6k_head.cpp packs them, times activations as Q8_K.
struct Q6KJob {
    const uint8_t* weights;
    const int8_t* scales;
    const uint16_t* d;
    int n_super;
    const Q8KRows* q;
    int64_t n_vocab;
    float* logits;
};

// Q4_K weights as q4k_matmul.cpp packs them, times activations as Q8_0.
struct Q4KJob {
    const uint8_t* packed;
    int n_superblocks;
    const QuantizedRows* q;
    int64_t n_vocab;  // outputs per row (run_groups' name for it)
    float* out;
};

// Where the parts of one group's packed Q4_K super-block start (q4k_matmul.cpp, "the packed
// layout"), and its size.
namespace q4k_layout {
constexpr size_t kValues = 0, kSc = 1024, kMin = 1088, kD = 1152, kDmin = 1168, kPackedBlock = 1184;
}  // namespace q4k_layout

using Q8Run = KernelRun<Q8Job>;
using Q6KRun = KernelRun<Q6KJob>;
using Q4KRun = KernelRun<Q4KJob>;

#ifdef LOCALSPEC_X86
HeadKernels<Q8Run> q8_kernels();  // x86/q8_tiles.cpp
HeadKernels<Q6KRun> q6k_kernels();  // x86/q6k_tiles.cpp
HeadKernels<Q4KRun> q4k_kernels();  // x86/q4k_tiles.cpp
#else
// The generic fallback: no kernels.
inline HeadKernels<Q8Run> q8_kernels() { return {}; }
inline HeadKernels<Q6KRun> q6k_kernels() { return {}; }
inline HeadKernels<Q4KRun> q4k_kernels() { return {}; }
#endif

}  // namespace localspec
