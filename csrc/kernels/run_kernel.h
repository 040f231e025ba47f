// The wrapper around each of localspec's int8 kernels (q8_head.cpp, q6k_head.cpp,
// q4k_matmul.cpp), written once: pick a kernel, quantize the activations as ggml does for the
// weight format, and run the kernel over output groups: all of them split over threads (a
// head's compute), those that hold a few tokens (compute_ids), or the ranges ggml's threads hand
// over (a body matmul).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/head_common.h"

namespace localspec {

// Job: a kernel's arguments; its member q (left null by the caller) points at the activations
// QUANTIZE(rows, x, n_rows, n_cols) fills, its member n_vocab counts the outputs per row.
// KERNELS: the format's kernels (tiles.h).
template <typename Job, typename Rows, void (*QUANTIZE)(Rows&, const float*, int, int),
          HeadKernels<KernelRun<Job>> (*KERNELS)()>
struct RunKernel {
    using Run = KernelRun<Job>;

    // A head's compute(): the kernel called `kernel` ("": `fastest`, the head's own choice) over
    // every group, split over n_threads. `format` names the weights in the error ("Q8_0").
    static void compute(Job job, Run fastest, const std::string& kernel, const char* format, const float* x,
                        int n_rows, int n_cols, int n_threads) {
        const Run run = kernel.empty() ? fastest : KERNELS().pick(kernel);
        if (!run) {
            throw std::invalid_argument(std::string("this CPU cannot run the ") + format + " head kernel '" + kernel + "'");
        }
        Rows q;
        QUANTIZE(q, x, n_rows, n_cols);
        job.q = &q;
        split_over_threads((job.n_vocab + 7) / 8, n_threads, [&](int64_t g0, int64_t g1) { run(job, g0, g1); });
    }

    // A head's compute_ids(): one row x, the kernel `run` on the groups that hold `ids`.
    static void compute_ids(Job job, Run run, const float* x, int n_cols, const std::vector<int32_t>& ids) {
        Rows q;
        QUANTIZE(q, x, 1, n_cols);
        job.q = &q;
        for_groups_of(ids, job.n_vocab, [&](int64_t g) { run(job, g, g + 1); });
    }

    // A body matmul: the fastest kernel this CPU runs (`missing`: the error where none) over the
    // group ranges `next` hands out, x quantized into rows kept per thread (one per ggml worker
    // thread: no allocation per call).
    static void matmul(Job job, const char* missing, const float* x, int n_rows, int n_cols,
                       const GroupRanges& next) {
        static const Run run = KERNELS().pick("");
        if (!run) throw std::logic_error(missing);
        thread_local Rows q;
        QUANTIZE(q, x, n_rows, n_cols);
        job.q = &q;
        for (int64_t g0 = 0, g1 = 0; next(g0, g1);) run(job, g0, g1);
    }
};

}  // namespace localspec
