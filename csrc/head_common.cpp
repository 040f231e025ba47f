#include "head_common.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef _WIN32
#include <malloc.h>
#else
#include <sys/mman.h>
#endif

namespace localspec {

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float value;
    if (exp == 0) {
        value = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    } else if (exp == 31) {
        value = mant ? NAN : INFINITY;
    } else {
        value = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
    }
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    bits |= sign;
    std::memcpy(&value, &bits, 4);
    return value;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return sign | (ax > 0x7f800000 ? 0x7e00 : 0x7c00);  // NaN, inf
    if (ax >= 0x477ff000) return sign | 0x7c00;  // rounds past the largest half
    auto round_even = [](uint32_t value, int shift) {
        uint32_t r = value >> shift;
        const uint32_t rem = value & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) ++r;
        return r;
    };
    if (ax < 0x38800000) {  // a subnormal half (or zero)
        if (ax < 0x33000000) return sign;
        const uint32_t mant = (ax & 0x7fffff) | 0x800000;
        return sign | static_cast<uint16_t>(round_even(mant, 126 - static_cast<int>(ax >> 23)));
    }
    return sign | static_cast<uint16_t>(round_even(ax - 0x38000000, 13));
}

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

void parallel_slices(int64_t n, int n_threads, const std::function<void(int64_t, int64_t)>& fn) {
    const int workers = std::max(1, n_threads);
#ifdef _OPENMP
#pragma omp parallel num_threads(workers)
    {
        const int t = omp_get_thread_num(), count = omp_get_num_threads();
        fn(n * t / count, n * (t + 1) / count);
    }
#else
    std::vector<std::thread> threads;
    for (int t = 1; t < workers; ++t) threads.emplace_back(fn, n * t / workers, n * (t + 1) / workers);
    fn(0, n / workers);
    for (std::thread& thread : threads) thread.join();
#endif
}

}  // namespace localspec
