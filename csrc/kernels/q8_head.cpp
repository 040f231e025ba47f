#include "kernels/q8_head.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ggml-cpu.h"
#include "kernels/int8_rows.h"
#include "kernels/run_kernel.h"
#include "kernels/tiles.h"


namespace localspec {

void q8_head_reference(const Q8Block* rows, int64_t n_vocab, int n_embd, const float* hidden,
                       int n_rows, float* logits) {
    QuantizedRows q;  // hidden states as Q8_0 (ggml's quantize_row_q8_0)
    quantize_rows_into(q, hidden, n_rows, n_embd);
    const int nb = q.n_blocks;
    for (int j = 0; j < n_rows; ++j) {
        for (int64_t v = 0; v < n_vocab; ++v) {
            float acc = 0.0f;
            for (int b = 0; b < nb; ++b) {
                const Q8Block& w = rows[v * nb + b];
                int8_t x[32];
                std::memcpy(x, &q.words[(static_cast<size_t>(j) * nb + b) * 8], 32);
                int isum = 0;
                for (int i = 0; i < 32; ++i) isum += w.qs[i] * x[i];
                acc += static_cast<float>(isum) * (fp16_to_fp32(w.d) * q.scale[static_cast<size_t>(j) * nb + b]);
            }
            logits[static_cast<size_t>(j) * static_cast<size_t>(n_vocab) + static_cast<size_t>(v)] = acc;
        }
    }
}

// ---- the packed layout ---------------------------------------------------------------------
//
// Vocabulary rows go in groups of 8 (the last group padded with zero rows). For group g and
// block b, `weights` holds 8 x 32 bytes: vector k has, in lane r, bytes 4k..4k+3 of row 8g+r's
// block b, each stored as w + 128 (an unsigned byte, as the dot-product instruction wants).
// So with x broadcast 4 bytes at a time, 8 multiply-adds give the 8 rows' block sums
// isum + 128 * sum(x), and `offset` (-128 * sum(x)) removes the excess.

namespace {
using Job = Q8Job;
using Run = Q8Run;  // a kernel: vocabulary groups g0 .. g1
using Kernel = RunKernel<Job, QuantizedRows, quantize_rows_into, q8_kernels>;
}  // namespace

struct Q8Head::Packed {
    Run run = nullptr;  // the fastest kernel this CPU runs, chosen when the head is made
    int n_blocks = 0;
    bool small = false;  // q8_pack's answer
    std::unique_ptr<HugePageBuffer> weights;  // [group][block][k][lane][4]
    std::vector<uint16_t> scales;  // [group][block][lane]: the fp16 d of each row's block
};

uint64_t q8_packed_weight_bytes(int64_t n_out, int n_in) {
    return static_cast<uint64_t>((n_out + 7) / 8) * static_cast<uint64_t>(n_in / 32) * 256;
}

uint64_t q8_packed_scale_bytes(int64_t n_out, int n_in) {
    return static_cast<uint64_t>((n_out + 7) / 8) * static_cast<uint64_t>(n_in / 32) * 16;
}

bool q8_pack(const Q8Block* rows, int64_t n_out, int n_in, uint8_t* weights, uint16_t* scales) {
    const int nb = n_in / 32;
    bool small = true;
    std::memset(weights, 128, q8_packed_weight_bytes(n_out, n_in));  // padding rows: w = 0
    std::memset(scales, 0, q8_packed_scale_bytes(n_out, n_in));
    for (int64_t v = 0; v < n_out; ++v) {
        const size_t g = static_cast<size_t>(v / 8), lane = static_cast<size_t>(v % 8);
        for (int b = 0; b < nb; ++b) {
            const Q8Block& block = rows[v * nb + b];
            const size_t gb = g * static_cast<size_t>(nb) + static_cast<size_t>(b);
            scales[gb * 8 + lane] = block.d;
            for (int i = 0; i < 32; ++i) {
                small = small && block.qs[i] >= -16 && block.qs[i] <= 15;
                weights[gb * 256 + static_cast<size_t>(i / 4) * 32 + lane * 4 + static_cast<size_t>(i % 4)] =
                    static_cast<uint8_t>(block.qs[i] + 128);
            }
        }
    }
    return small;
}

uint64_t Q8Head::packed_bytes(int64_t n_vocab, int n_embd) {
    return q8_packed_weight_bytes(n_vocab, n_embd) + q8_packed_scale_bytes(n_vocab, n_embd);
}

Q8Head::Q8Head(const Q8Block* rows, int64_t n_vocab, int n_embd)
    : packed_(std::make_unique<Packed>()), n_vocab_(n_vocab), n_embd_(n_embd) {
    if (n_embd <= 0 || n_embd % 32 != 0) throw std::invalid_argument("Q8_0 rows hold whole blocks");
    Packed& p = *packed_;
    p.run = q8_kernels().pick("");
    p.n_blocks = n_embd / 32;
    p.weights = std::make_unique<HugePageBuffer>(q8_packed_weight_bytes(n_vocab, n_embd));
    p.scales.assign(q8_packed_scale_bytes(n_vocab, n_embd) / sizeof(uint16_t), 0);
    p.small = q8_pack(rows, n_vocab, n_embd, p.weights->data(), p.scales.data());
}

Q8Head::~Q8Head() = default;

// ---- the kernel (tiles.h; on x86 its tiles are x86/q8_tiles.cpp) ---------------------------

bool int8_kernels_supported() { return q8_kernels().pick("") != nullptr; }

std::vector<std::string> Q8Head::kernel_names() { return head_kernel_names(); }

void Q8Head::compute(const float* hidden, int n_rows, float* logits, int n_threads, const std::string& kernel) const {
    const Packed& p = *packed_;
    const Job job{p.weights->data(), p.scales.data(), p.n_blocks, p.small, nullptr, n_vocab_, logits};
    Kernel::compute(job, p.run, kernel, "Q8_0", hidden, n_rows, n_embd_, n_threads);
}

void q8_matmul(const Q8PackedMatrix& m, const float* x, int n_rows, float* out, const GroupRanges& next) {
    const Job job{m.weights, m.scales, m.n_in / 32, m.small, nullptr, m.n_out, out};
    Kernel::matmul(job, "q8_matmul needs x86-64 with AVX2", x, n_rows, m.n_in, next);
}

void Q8Head::compute_ids(const float* hidden, const std::vector<int32_t>& ids, float* logits) const {
    const Packed& p = *packed_;
    const Job job{p.weights->data(), p.scales.data(), p.n_blocks, p.small, nullptr, n_vocab_, logits};
    Kernel::compute_ids(job, p.run, hidden, n_embd_, ids);
}

}  // namespace localspec
