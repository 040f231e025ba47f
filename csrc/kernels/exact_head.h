// Exact mode's output head (docs/exact.md): every logits row gets the same bits whatever the
// number of rows in the pass and the row's place in it.
//
// It computes each logit exactly as ggml's CPU backend does for a single-token pass: the hidden
// row is converted with the weights' `from_float` (to Q8_0, Q8_K, F16, ...) and each vocabulary
// row's logit is one call of the type's `vec_dot` (ggml_get_type_traits_cpu: AVX2, AVX512, NEON
// or scalar, whatever the library was built for). A logit then depends on its hidden row and
// the weights only, never on the other rows — where llama.cpp's batched paths (llamafile sgemm,
// repacked layouts) sum in another order — and equals llama.cpp's own one-row logit bit for
// bit. Any weight type the CPU backend can multiply works. The cost: no weight reuse across rows
// beyond a cache-sized tile, so r rows cost up to r heads (the batched head kernels reuse them).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/head_common.h"

struct ggml_tensor;

namespace localspec {

class ExactHead : public OutputHead {
public:
    // `weights`: the head's matrix as llama.cpp holds it in CPU memory ({n_embd, n_vocab},
    // contiguous rows). Keeps a pointer: the model must outlive the head.
    explicit ExactHead(const ggml_tensor* weights);
    // Whether ggml's CPU backend has a one-row dot product for these weights.
    static bool supports(const ggml_tensor* weights);

    const char* name() const override { return "localspec-exact"; }
    int64_t n_vocab() const override { return n_vocab_; }
    int n_embd() const override { return n_embd_; }
    void compute(const float* hidden, int n_rows, float* logits, int n_threads,
                 const std::string& kernel = "") const override;

private:
    const uint8_t* data_;
    size_t row_bytes_;  // one vocabulary row of weights
    int type_;  // ggml_type of the weights
    int64_t n_vocab_;
    int n_embd_;
};

}  // namespace localspec
