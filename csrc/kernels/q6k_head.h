// The target's output head on the CPU, when its weights are Q6_K (what llama.cpp's Q4_K_M and
// Q5_K_M give most models' output heads).
//
// Why, as for the Q8_0 head (q8_head.h): llama.cpp's CPU matmul costs roughly another head for
// every extra logits row, and verification asks for k + 1 rows. This head reads its weights
// once per call for up to 8 rows.
//
// Same numbers as llama.cpp: the hidden states are quantized to Q8_K exactly as ggml does on
// x86 (quantize_row_q8_K_ref: per 256 values, the value of largest magnitude m, iscale =
// -127 / m, q = min(127, round-half-even(x * iscale)), d = 1 / iscale), and per 256-value
// super-block the integer sum over its 16 sub-blocks of scale_j * sum((w - 32) * q) is exact;
// logit = sum over super-blocks of d_w * d_x * isum. Only the order of the float additions
// differs from llama.cpp's kernel (relative differences ~1e-7).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/head_common.h"

namespace localspec {

// ggml's block_q6_K: 256 weights of 6 bits (low 4 bits in ql, high 2 in qh), an int8 scale per
// 16 weights and an fp16 super-block scale d. Weight k = d * scales[k / 16] * (q_k - 32).
struct Q6KBlock {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
};
static_assert(sizeof(Q6KBlock) == 210, "block_q6_K is 210 bytes");

// The 256 unsigned 6-bit values q_k (0..63) of a block, in weight order.
void q6k_unpack(const Q6KBlock& block, uint8_t out[256]);

// The same kernel on a matrix whose packed bytes live elsewhere (body_matmul.cpp keeps them in
// ggml's buffers): n_out rows of n_in / 256 blocks.
struct Q6KPackedMatrix {
    const uint8_t* weights;  // [group of 8 rows][super][j]: 96 bytes of 6-bit values (q6k_head.cpp)
    const int8_t* scales;  // [group][super][j][lane]
    const uint16_t* d;  // [group][super][lane], fp16
    int64_t n_out;
    int n_in;
};
uint64_t q6k_packed_bytes(int64_t n_out, int n_in);
void q6k_pack(const Q6KBlock* rows, int64_t n_out, int n_in, uint8_t* packed);
Q6KPackedMatrix q6k_view(const uint8_t* packed, int64_t n_out, int n_in);
// out[j * n_out + o] = row o . x row j for the rows o of the 8-row groups `next` hands out, x
// quantized as ggml's Q8_K: every output one sum in a fixed order, the same bits in every batch.
void q6k_matmul(const Q6KPackedMatrix& m, const float* x, int n_rows, float* out, const GroupRanges& next);

class Q6KHead : public OutputHead {
public:
    static std::vector<std::string> kernel_names();  // as Q8Head's, fastest first
    // Memory of the repacked copy for a head of this shape.
    static uint64_t packed_bytes(int64_t n_vocab, int n_embd);

    // `rows`: n_vocab rows of n_embd / 256 blocks, as ggml stores a Q6_K matrix. Copies them
    // into the kernel's layout (8 vocabulary rows interleaved). n_embd % 256 == 0.
    Q6KHead(const Q6KBlock* rows, int64_t n_vocab, int n_embd);
    ~Q6KHead() override;

    const char* name() const override { return "localspec-q6_k"; }
    int64_t n_vocab() const override { return n_vocab_; }
    int n_embd() const override { return n_embd_; }
    void compute(const float* hidden, int n_rows, float* logits, int n_threads,
                 const std::string& kernel = "") const override;
    // As Q8Head's: the groups holding `ids`, the same bits as compute().
    bool computes_ids() const override { return true; }
    void compute_ids(const float* hidden, const std::vector<int32_t>& ids, float* logits) const override;

private:
    struct Packed;
    std::unique_ptr<Packed> packed_;
    int64_t n_vocab_;
    int n_embd_;
};

// The same arithmetic one value at a time, straight from ggml's layout (the tests' reference).
void q6k_head_reference(const Q6KBlock* rows, int64_t n_vocab, int n_embd, const float* hidden, int n_rows,
                        float* logits);

}  // namespace localspec
