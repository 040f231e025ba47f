#include "kernels/q6k_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/int8_rows.h"
#include "kernels/run_kernel.h"
#include "kernels/tiles.h"


namespace localspec {

void q6k_unpack(const Q6KBlock& block, uint8_t out[256]) {
    // ggml's dequantize_row_q6_K: two halves of 128 values, each from 64 ql and 32 qh bytes.
    for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = block.ql + 64 * half;
        const uint8_t* qh = block.qh + 32 * half;
        uint8_t* q = out + 128 * half;
        for (int l = 0; l < 32; ++l) {
            q[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
            q[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            q[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            q[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

void q6k_head_reference(const Q6KBlock* rows, int64_t n_vocab, int n_embd, const float* hidden, int n_rows,
                        float* logits) {
    Q8KRows q;  // hidden states as Q8_K (ggml's quantize_row_q8_K)
    quantize_q8k_into(q, hidden, n_rows, n_embd);
    const int ns = q.n_super;
    for (int r = 0; r < n_rows; ++r) {
        for (int64_t v = 0; v < n_vocab; ++v) {
            float acc = 0.0f;
            for (int s = 0; s < ns; ++s) {
                const Q6KBlock& block = rows[v * ns + s];
                uint8_t w[256];
                q6k_unpack(block, w);
                int8_t x[256];
                const size_t rs = static_cast<size_t>(r) * ns + static_cast<size_t>(s);
                std::memcpy(x, &q.words[rs * 64], 256);
                int isum = 0;
                for (int j = 0; j < 16; ++j) {
                    int sub = 0;
                    for (int i = 16 * j; i < 16 * j + 16; ++i) sub += (w[i] - 32) * x[i];
                    isum += block.scales[j] * sub;
                }
                acc += static_cast<float>(isum) * (fp16_to_fp32(block.d) * q.scale[rs]);
            }
            logits[static_cast<size_t>(r) * static_cast<size_t>(n_vocab) + static_cast<size_t>(v)] = acc;
        }
    }
}

// ---- the packed layout ---------------------------------------------------------------------
//
// Vocabulary rows go in groups of 8 (the last group padded with zero rows). For group g,
// super-block s and sub-block j (16 weights), the kernel multiplies 4 vectors: vector k has, in
// lane r, weights 4k..4k+3 of row 8g+r's sub-block, as unsigned 6-bit values q (w = q - 32).
// They are stored in 96 bytes, as many bits as ggml's block: the low 4 bits of vectors 0 and 1
// (one in each nibble of 32 bytes), the same for vectors 2 and 3, then the high 2 bits of all
// four (bits 2k..2k+1 of 32 bytes). With x broadcast 4 bytes at a time, 4 multiply-adds started
// from -32 * sum(x) give the 8 rows' sub-block sums; each is multiplied by its row's scale and
// the 16 add up to the super-block's.

constexpr size_t kSubBytes = 96;  // one sub-block of 8 rows: 2 x 32 bytes of nibbles, 32 of high bits
constexpr size_t kSuperBytes = 16 * kSubBytes + 128 + 16;  // + int8 scales + fp16 d: 8 x 210

namespace {
using Job = Q6KJob;
using Run = Q6KRun;  // a kernel: vocabulary groups g0 .. g1
using Kernel = RunKernel<Job, Q8KRows, quantize_q8k_into, q6k_kernels>;
}  // namespace

struct Q6KHead::Packed {
    Run run = nullptr;  // the fastest kernel this CPU runs, chosen when the head is made
    int n_super = 0;
    // q6k_pack's layout: [group][super][j] 96 bytes of values, then [group][super][j][lane]
    // scales, then [group][super][lane] fp16 d.
    std::unique_ptr<HugePageBuffer> packed;
    Q6KPackedMatrix view{};
};

uint64_t Q6KHead::packed_bytes(int64_t n_vocab, int n_embd) { return q6k_packed_bytes(n_vocab, n_embd); }

uint64_t q6k_packed_bytes(int64_t n_out, int n_in) {
    return static_cast<uint64_t>((n_out + 7) / 8) * static_cast<uint64_t>(n_in / 256) * kSuperBytes;
}

Q6KPackedMatrix q6k_view(const uint8_t* packed, int64_t n_out, int n_in) {
    const size_t group_supers = static_cast<size_t>((n_out + 7) / 8) * static_cast<size_t>(n_in / 256);
    const size_t value_bytes = group_supers * 16 * kSubBytes;
    return {packed, reinterpret_cast<const int8_t*>(packed + value_bytes),
            reinterpret_cast<const uint16_t*>(packed + value_bytes + group_supers * 128), n_out, n_in};
}

void q6k_pack(const Q6KBlock* rows, int64_t n_out, int n_in, uint8_t* packed) {
    const Q6KPackedMatrix m = q6k_view(packed, n_out, n_in);
    auto* weights = const_cast<uint8_t*>(m.weights);
    auto* scales = const_cast<int8_t*>(m.scales);
    auto* d = const_cast<uint16_t*>(m.d);
    const int n_super = n_in / 256;
    const int64_t n_padded = (n_out + 7) / 8 * 8;
    std::memset(packed, 0, q6k_packed_bytes(n_out, n_in));
    for (int64_t v = 0; v < n_padded; ++v) {
        const size_t g = static_cast<size_t>(v / 8), lane = static_cast<size_t>(v % 8);
        for (int s = 0; s < n_super; ++s) {
            const size_t gs = g * static_cast<size_t>(n_super) + static_cast<size_t>(s);
            uint8_t q[256];
            if (v < n_out) {
                const Q6KBlock& block = rows[v * n_super + s];
                q6k_unpack(block, q);
                d[gs * 8 + lane] = block.d;
                for (size_t j = 0; j < 16; ++j) scales[(gs * 16 + j) * 8 + lane] = block.scales[j];
            } else {
                std::memset(q, 32, sizeof q);  // padding rows: q = 32, w = 0 (scale and d 0 too)
            }
            for (size_t j = 0; j < 16; ++j) {
                uint8_t* sub = weights + (gs * 16 + j) * kSubBytes;
                for (size_t i = 0; i < 16; ++i) {
                    const size_t k = i / 4, byte = lane * 4 + i % 4;
                    const uint8_t value = q[16 * j + i];
                    sub[32 * (k / 2) + byte] |= static_cast<uint8_t>((value & 0xF) << (4 * (k % 2)));
                    sub[64 + byte] |= static_cast<uint8_t>((value >> 4) << (2 * k));
                }
            }
        }
    }
}

Q6KHead::Q6KHead(const Q6KBlock* rows, int64_t n_vocab, int n_embd)
    : packed_(std::make_unique<Packed>()), n_vocab_(n_vocab), n_embd_(n_embd) {
    if (n_embd <= 0 || n_embd % 256 != 0) throw std::invalid_argument("Q6_K rows hold whole super-blocks");
    Packed& p = *packed_;
    p.run = q6k_kernels().pick("");
    p.n_super = n_embd / 256;
    p.packed = std::make_unique<HugePageBuffer>(q6k_packed_bytes(n_vocab, n_embd));
    q6k_pack(rows, n_vocab, n_embd, p.packed->data());
    p.view = q6k_view(p.packed->data(), n_vocab, n_embd);
}

Q6KHead::~Q6KHead() = default;

// ---- the kernel (tiles.h; on x86 its tiles are x86/q6k_tiles.cpp) --------------------------

std::vector<std::string> Q6KHead::kernel_names() { return head_kernel_names(); }

void Q6KHead::compute(const float* hidden, int n_rows, float* logits, int n_threads, const std::string& kernel) const {
    const Packed& p = *packed_;
    const Job job{p.view.weights, p.view.scales, p.view.d, p.n_super, nullptr, n_vocab_, logits};
    Kernel::compute(job, p.run, kernel, "Q6_K", hidden, n_rows, n_embd_, n_threads);
}

void Q6KHead::compute_ids(const float* hidden, const std::vector<int32_t>& ids, float* logits) const {
    const Packed& p = *packed_;
    const Job job{p.view.weights, p.view.scales, p.view.d, p.n_super, nullptr, n_vocab_, logits};
    Kernel::compute_ids(job, p.run, hidden, n_embd_, ids);
}

void q6k_matmul(const Q6KPackedMatrix& m, const float* x, int n_rows, float* out, const GroupRanges& next) {
    const Job job{m.weights, m.scales, m.d, m.n_in / 256, nullptr, m.n_out, out};
    Kernel::matmul(job, "q6k_matmul needs x86-64 with AVX2", x, n_rows, m.n_in, next);
}

}  // namespace localspec
