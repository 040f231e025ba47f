// The target's output head on the CPU, when its weights are Q8_0.
//
// Why it exists: in a small model with a large vocabulary (Gemma 3 270M: 262,144 x 640) the
// output head is most of a target pass, and llama.cpp's CPU matmul costs roughly another head
// for every extra row that asks for logits. Verification asks for k + 1 rows. This head reads
// the weights once per call whatever the row count (up to ~8 rows it stays memory-bound), so a
// verification batch costs little more than one token; and its copy of the weights, in 2 MiB
// pages, streams faster than llama.cpp's memory-mapped file even for one row.
//
// Same numbers as llama.cpp: the hidden states are quantized to Q8_0 exactly as ggml does
// (per 32 values: d = max|x| / 127 stored as fp16, q = round-to-even(x * 127 / max|x|)), each
// 32-value block's dot product is exact integer arithmetic, and logit = sum over blocks of
// d_w * d_x * isum. Only the order of the float additions differs from llama.cpp's kernels
// (relative differences ~1e-6, the same kind that already separates its own batch shapes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/head_common.h"

namespace localspec {

// ggml's block_q8_0: 32 int8 weights and their fp16 scale.
struct Q8Block {
    uint16_t d;
    int8_t qs[32];
};
static_assert(sizeof(Q8Block) == 34, "block_q8_0 is 34 bytes");

// Whether this CPU runs localspec's int8 kernels (x86-64 with AVX2, AVX-VNNI or AVX512-VNNI):
// asked of the Q8_0 head's kernels, and it holds for the Q6_K head's and the body matmuls'
// (body_matmul.h) too, which run on the same instruction sets (head_kernel_names()).
bool int8_kernels_supported();

class Q8Head : public OutputHead {
public:
    // The kernels this CPU can run, fastest first (head_kernel_names()).
    static std::vector<std::string> kernel_names();
    // Memory of the repacked copy for a head of this shape.
    static uint64_t packed_bytes(int64_t n_vocab, int n_embd);

    // `rows`: n_vocab rows of n_embd / 32 blocks, as ggml stores a Q8_0 matrix. Copies them
    // into the kernel's layout (8 vocabulary rows interleaved per block). n_embd % 32 == 0.
    Q8Head(const Q8Block* rows, int64_t n_vocab, int n_embd);
    ~Q8Head();

    const char* name() const override { return "localspec-q8_0"; }
    int64_t n_vocab() const override { return n_vocab_; }
    int n_embd() const override { return n_embd_; }
    void compute(const float* hidden, int n_rows, float* logits, int n_threads,
                 const std::string& kernel = "") const override;
    // Only the 8-row groups that hold `ids`, with the same kernel: every logit is a sum over
    // blocks in the same order whatever the tile, so the bits equal compute()'s.
    bool computes_ids() const override { return true; }
    void compute_ids(const float* hidden, const std::vector<int32_t>& ids, float* logits) const override;

private:
    struct Packed;
    std::unique_ptr<Packed> packed_;
    int64_t n_vocab_;
    int n_embd_;
};

// The same kernel on a matrix whose packed bytes live elsewhere (body_matmul.cpp keeps them in
// ggml's buffers): n_out rows of n_in / 32 blocks, packed as the head packs its vocabulary.
struct Q8PackedMatrix {
    const uint8_t* weights;  // q8_packed_weight_bytes(): [group of 8 rows][block][k][lane][4]
    const uint16_t* scales;  // q8_packed_scale_bytes(): [group][block][lane], fp16
    int64_t n_out;
    int n_in;
    // Every value within [-16, 15] (Q5_0 and Q4_0 widened): AVX2's kernel then needs no sign
    // trick (x86/q8_tiles.cpp, tile_avx2_small).
    bool small;
};
uint64_t q8_packed_weight_bytes(int64_t n_out, int n_in);
uint64_t q8_packed_scale_bytes(int64_t n_out, int n_in);
// Returns whether every value lies within [-16, 15] (Q8PackedMatrix::small).
bool q8_pack(const Q8Block* rows, int64_t n_out, int n_in, uint8_t* weights, uint16_t* scales);
// out[j * n_out + o] = row o . x row j (j < n_rows, x rows of n_in floats one after another),
// for the rows o of the 8-row groups `next` hands out, with the fastest kernel this CPU runs
// (int8_kernels_supported() must hold). Each output is a sum over blocks in one order whatever
// n_rows and the groups: the same bits for a row in every batch and every split over threads.
void q8_matmul(const Q8PackedMatrix& m, const float* x, int n_rows, float* out, const GroupRanges& next);

// The same arithmetic one value at a time, straight from ggml's layout (the tests' reference).
void q8_head_reference(const Q8Block* rows, int64_t n_vocab, int n_embd, const float* hidden,
                       int n_rows, float* logits);

}  // namespace localspec
