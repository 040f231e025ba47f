// The output head on the CPU when its weights are F16 (an unquantized GGUF, or a quantized
// one that kept its head in F16). Why: as for q8_head.h, llama.cpp's CPU matmul pays roughly
// another head for every extra row with logits; this head reads the weights once per call,
// from a copy in 2 MiB pages.
//
// Same numbers as llama.cpp: ggml multiplies F16 weights by hidden states first rounded to
// F16 (its vec_dot_type for F16), with products and sums in F32. Only the order of the
// additions differs (relative differences ~1e-6).
#pragma once

#include <cstdint>
#include <memory>

#include "head_common.h"

namespace localspec {

class F16Head : public OutputHead {
public:
    // The instructions the kernel needs (x86-64 with AVX2, FMA and F16C).
    static bool cpu_supported();

    // `rows`: n_vocab rows of n_embd fp16 values, as ggml stores an F16 matrix. Copies them
    // into the kernel's layout (8 vocabulary rows interleaved per column).
    F16Head(const uint16_t* rows, int64_t n_vocab, int n_embd);
    ~F16Head() override;

    const char* name() const override { return "localspec-f16"; }
    int64_t n_vocab() const override { return n_vocab_; }
    int n_embd() const override { return n_embd_; }
    void compute(const float* hidden, int n_rows, float* logits, int n_threads) const override;

private:
    std::unique_ptr<HugePageBuffer> weights_;  // [group][column][lane]: fp16
    int64_t n_vocab_;
    int64_t n_groups_;
    int n_embd_;
};

}  // namespace localspec
