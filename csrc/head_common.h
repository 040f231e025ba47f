// What localspec's output heads (q8_head.h, f16_head.h) share: fp16 conversion, memory in
// 2 MiB pages, splitting the vocabulary over threads, and the interface the graph hook
// (head_hook.h) computes logits through. No llama.h, no ggml.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace localspec {

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even, as F16C does

// An output head: logits[j * n_vocab + v] = head row v . hidden row j, for j < n_rows.
class OutputHead {
public:
    virtual ~OutputHead() = default;
    virtual const char* name() const = 0;  // "localspec-q8_0", "localspec-f16"
    virtual int64_t n_vocab() const = 0;
    virtual int n_embd() const = 0;
    virtual void compute(const float* hidden, int n_rows, float* logits, int n_threads) const = 0;
};

// Memory for packed head weights, in 2 MiB pages where the kernel allows it: every call
// streams the whole head, and with 4 KiB pages the walks over ~50,000 page-table entries
// (evicted by the model's own weights between calls) cost about a tenth of a call here.
class HugePageBuffer {
public:
    explicit HugePageBuffer(size_t size);
    ~HugePageBuffer();
    HugePageBuffer(const HugePageBuffer&) = delete;
    HugePageBuffer& operator=(const HugePageBuffer&) = delete;
    uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

private:
    uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// fn(begin, end) over n_threads equal slices of [0, n). With OpenMP (how llama.cpp's CPU
// backend runs) it uses llama.cpp's already spinning worker threads rather than competing
// with them; otherwise plain threads.
void parallel_slices(int64_t n, int n_threads, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace localspec
