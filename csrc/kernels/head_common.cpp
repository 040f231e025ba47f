#include "kernels/head_common.h"

#include "ggml.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef _WIN32
#include <malloc.h>
#else
#include <sys/mman.h>
#endif

namespace localspec {

HugePageBuffer::HugePageBuffer(size_t size) : size_(size) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t rounded = (size + kHuge - 1) / kHuge * kHuge;
#ifdef _WIN32
    data_ = static_cast<uint8_t*>(_aligned_malloc(rounded, kHuge));
    if (!data_) throw std::bad_alloc();
#else
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, rounded) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, rounded, MADV_HUGEPAGE);
#endif
    data_ = static_cast<uint8_t*>(p);
#endif
}

#ifdef _WIN32
HugePageBuffer::~HugePageBuffer() { _aligned_free(data_); }
#else
HugePageBuffer::~HugePageBuffer() { std::free(data_); }
#endif

void split_over_threads(int64_t n_items, int n_threads, const std::function<void(int64_t, int64_t)>& run) {
    const int workers = std::max(1, n_threads);
#ifdef _OPENMP
#pragma omp parallel num_threads(workers)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        run(n_items * t / n, n_items * (t + 1) / n);
    }
    return;
#endif
    std::vector<std::thread> threads;
    for (int t = 1; t < workers; ++t) {
        threads.emplace_back(run, n_items * t / workers, n_items * (t + 1) / workers);
    }
    run(0, n_items / workers);
    for (std::thread& thread : threads) thread.join();
}

void release_compute_threads() {
#ifdef _OPENMP
    omp_pause_resource_all(omp_pause_soft);
#endif
}

namespace {

std::vector<std::string> find_kernel_names() {
    std::vector<std::string> out;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("f16c") || !__builtin_cpu_supports("fma")) return out;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")) {
        out.emplace_back("avx512vnni");  // with the pair tiles' 512-bit byte shifts (x86/int8_tiles.h)
    }
    if (__builtin_cpu_supports("avxvnni")) out.emplace_back("avxvnni");
    if (__builtin_cpu_supports("avx2")) out.emplace_back("avx2");
#endif
    return out;
}

}  // namespace

const std::vector<std::string>& head_kernel_names() {
    static const std::vector<std::string> names = find_kernel_names();
    return names;
}

float fp16_to_fp32(uint16_t h) { return ggml_fp16_to_fp32(h); }
uint16_t fp32_to_fp16(float f) { return ggml_fp32_to_fp16(f); }

}  // namespace localspec
