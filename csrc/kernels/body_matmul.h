// localspec's own matrix products for the target's transformer body on the CPU, plugged into
// ggml's CPU backend as one more "extra buffer type" (the mechanism llama.cpp's repacked layouts
// and AMX use): weights placed in it are packed by localspec when loaded, and ggml hands every
// MUL_MAT on them to localspec's kernel.
//
// Why: exact mode (docs/exact.md) needs every row of a pass to get the same bits whatever the
// number of rows. ggml's reference kernels give that but sum each block's 8 lanes in float, one
// conversion and one multiply-add per 32 products. localspec's kernels sum a block's products
// exactly in integers (VNNI's multiply-add, 4 products per lane) and add one float per block:
// each output is one chain over its blocks in a fixed order, so a row's bits never depend on the
// batch, and rows cost less. Q8_0, Q5_0 and Q4_0 weights are widened to int8 for the output
// head's kernel (q8_head.h); Q4_K has its own (q4k_matmul.h); Q6_K uses the Q6_K head's
// (q6k_head.h). Other quantized types go through ggml's own one-row dot product (vec_dot), row
// by row: batch invariant too, at ggml's one-row speed.
//
// Default mode uses the kernels that are faster than llama.cpp's for any row count here
// (faster_body_types()); exact mode every kernel (BodyKernelClaim).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace localspec {

// Whether ggml offers localspec's buffer type to llama.cpp's loader in this process. It must be
// registered before llama.cpp first asks ggml for its extra buffer types (the first model load
// with them); Model does so. False on a CPU without the head's kernels (AVX2 at least) or when
// another library loaded a model first.
bool body_kernels_available();

// While one is alive, llama.cpp's loader places the matrices of the model it loads (MUL_MAT
// weights, never the output head) in localspec's buffer type; otherwise that type declines
// every weight. Only the engine thread loads models, one at a time.
class BodyKernelClaim {
public:
    enum Scope {
        // The types localspec's kernels multiply faster than llama.cpp's for a verification
        // pass's few rows and at least about as fast for one row and a prompt's hundreds:
        // faster_body_types().
        Faster = 1,
        // Every quantized matrix: what exact mode needs (no repacked layout may compute a row).
        All = 2,
    };
    explicit BodyKernelClaim(Scope scope);
    ~BodyKernelClaim();
    BodyKernelClaim(const BodyKernelClaim&) = delete;
    BodyKernelClaim& operator=(const BodyKernelClaim&) = delete;
};

// The ggml type names default mode's claim (BodyKernelClaim::Faster) takes: Q8_0, Q5_0, Q4_K
// and Q6_K, on every x86 kernel set. On the real Qwen2.5-Coder 1.5B Q4_K_M (issue 51) one row
// decodes as fast as with llama.cpp's repacked kernels at 2 threads and faster at 1, since the
// tiles prefetch their weights into L2 (x86/int8_tiles.h, prefetch_block), and a verification
// pass's extra rows cost a fraction of what they cost llama.cpp's (a 2-row pass 1.16x a one-row
// pass at 1 thread against 1.84x; docs/design.md, "Body kernels").
std::vector<std::string> faster_body_types();

// How many weights localspec's buffer type holds in this process (tests: a model loaded under a
// claim must have put its matrices there).
long body_kernel_tensors();

// y = W x through a real ggml graph on the CPU backend, W (n_out rows of n_in values, ggml type
// `type_name`, its raw bytes) in localspec's buffer type or, for comparison, ggml's own; x holds
// rows of n_in floats. Returns the rows of y, n_out values each (tests; `repeat` computes the
// graph that many times, for timing the product without its setup).
std::vector<float> body_matmul_via_ggml(const std::string& type_name, const std::vector<uint8_t>& weights,
                                        int64_t n_out, int n_in, const std::vector<float>& x, int n_threads,
                                        bool localspec_buffer, int repeat = 1);

}  // namespace localspec
