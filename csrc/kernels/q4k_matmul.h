// Q4_K matrices times rows of activations with localspec's int8 kernel (body_matmul.h keeps
// the packed bytes in ggml's buffers).
//
// A Q4_K weight is d * sc * q - dmin * m: per 256 values two fp16 scales d and dmin, per 32
// values 6-bit integers sc and m, per value a 4-bit q. With x quantized per 32 values as ggml's
// Q8_0 (x = dx * xq), one 32-value sub-block contributes
//     dx * (d*sc * sum(q * xq) - dmin*m * sum(xq)),
// whose sums are exact integers (one multiply-add instruction per 4 products) and d*sc and
// dmin*m exact floats (an 11-bit by 6-bit product). Each output is one chain of float
// multiply-adds over its sub-blocks in a fixed order, whatever the number of rows: a row gets
// the same bits in every batch. The packed copy keeps the 4-bit values (4.6 bits per weight).
#pragma once

#include <cstdint>

#include "kernels/head_common.h"

namespace localspec {

// ggml's block_q4_K.
struct Q4KBlock {
    uint16_t d, dmin;
    uint8_t scales[12];  // 8 pairs (sc, m) of 6 bits
    uint8_t qs[128];  // per 64 values: the first 32 in the low nibbles, the next 32 in the high
};
static_assert(sizeof(Q4KBlock) == 144, "block_q4_K is 144 bytes");

// Whether this CPU runs the kernel (x86-64 with AVX2 at least).
bool q4k_matmul_supported();
// Bytes of the packed copy of n_out rows of n_in values (n_in % 256 == 0).
uint64_t q4k_packed_bytes(int64_t n_out, int n_in);
// Packs ggml's rows (n_out rows of n_in / 256 blocks) into `packed` (q4k_packed_bytes()).
void q4k_pack(const Q4KBlock* rows, int64_t n_out, int n_in, uint8_t* packed);
// out[j * n_out + o] = row o . x row j for the rows o of the 8-row groups `next` hands out (x:
// n_rows rows of n_in floats one after another).
void q4k_matmul(const uint8_t* packed, int64_t n_out, int n_in, const float* x, int n_rows, float* out,
                const GroupRanges& next);

}  // namespace localspec
