#include "kernels/q4k_matmul.h"

#include <algorithm>
#include <cstring>

#include "kernels/head_common.h"
#include "kernels/int8_rows.h"
#include "kernels/run_kernel.h"
#include "kernels/tiles.h"


namespace localspec {

// ---- the packed layout -----------------------------------------------------------------------
//
// Output rows go in groups of 8 (the last padded with zero rows). For group g and super-block B
// (256 values), kPackedBlock bytes: the 4-bit values, then each sub-block's sc and m for the 8
// rows, then their d and dmin. Vector (c, k) of the values holds, in lane r, bytes 4k..4k+3 of
// row 8g+r's qs[32c .. 32c+31]: its low nibbles are values 4k..4k+3 of sub-block 2c, its high
// nibbles those of sub-block 2c+1, so one shift and one mask give 8 rows x 4 values.

namespace {

using namespace q4k_layout;  // kValues, kSc, kMin, kD, kDmin, kPackedBlock (tiles.h)

// sc and m of sub-block s (ggml's get_scale_min_k4).
void scale_min(const uint8_t* q, int s, uint8_t& sc, uint8_t& m) {
    if (s < 4) {
        sc = q[s] & 63;
        m = q[s + 4] & 63;
    } else {
        sc = static_cast<uint8_t>((q[s + 4] & 0x0F) | ((q[s - 4] >> 6) << 4));
        m = static_cast<uint8_t>((q[s + 4] >> 4) | ((q[s] >> 6) << 4));
    }
}

}  // namespace

uint64_t q4k_packed_bytes(int64_t n_out, int n_in) {
    return static_cast<uint64_t>((n_out + 7) / 8) * static_cast<uint64_t>(n_in / 256) * kPackedBlock;
}

void q4k_pack(const Q4KBlock* rows, int64_t n_out, int n_in, uint8_t* packed) {
    const int nsb = n_in / 256;
    std::memset(packed, 0, q4k_packed_bytes(n_out, n_in));  // padding rows: every scale 0
    for (int64_t o = 0; o < n_out; ++o) {
        const size_t lane = static_cast<size_t>(o % 8);
        for (int b = 0; b < nsb; ++b) {
            const Q4KBlock& block = rows[o * nsb + b];
            uint8_t* p = packed + (static_cast<size_t>(o / 8) * static_cast<size_t>(nsb) + static_cast<size_t>(b)) * kPackedBlock;
            for (size_t ck = 0; ck < 32; ++ck) {  // vector (c, k) = 8c + k: qs[32c + 4k ..]
                std::memcpy(p + kValues + ck * 32 + lane * 4, block.qs + (ck / 8) * 32 + (ck % 8) * 4, 4);
            }
            for (int s = 0; s < 8; ++s) scale_min(block.scales, s, p[kSc + s * 8 + lane], p[kMin + s * 8 + lane]);
            std::memcpy(p + kD + lane * 2, &block.d, 2);
            std::memcpy(p + kDmin + lane * 2, &block.dmin, 2);
        }
    }
}

// ---- the kernel (tiles.h; on x86 its tiles are x86/q4k_tiles.cpp) ----------------------------

bool q4k_matmul_supported() { return q4k_kernels().pick("") != nullptr; }

void q4k_matmul(const uint8_t* packed, int64_t n_out, int n_in, const float* x, int n_rows, float* out,
                const GroupRanges& next) {
    const Q4KJob job{packed, n_in / 256, nullptr, n_out, out};
    RunKernel<Q4KJob, QuantizedRows, quantize_rows_into, q4k_kernels>::matmul(job, "q4k_matmul needs x86-64 with AVX2",
                                                                              x, n_rows, n_in, next);
}

}  // namespace localspec
