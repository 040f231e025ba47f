#include "kernels/q6k_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "ggml-cpu.h"
#include "kernels/int8_tiles.h"
#include "kernels/run_kernel.h"



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

// ---- hidden states as Q8_K (ggml's quantize_row_q8_K) --------------------------------------

namespace {

struct Q8KRows {
    int n_rows = 0, n_super = 0;
    std::vector<int32_t> words;  // [row][super][j][4]: sub-block j's 16 int8 values, 4 per int32
    std::vector<int32_t> offset;  // [row][super][j]: -32 * (sum of sub-block j's values)
    std::vector<float> scale;  // [row][super]: d
};

// ggml's block_q8_K: 256 int8 values, their float scale d and (unused here) sums per 16.
struct Q8KBlock {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
};
static_assert(sizeof(Q8KBlock) == 292, "block_q8_K is 292 bytes");

// ggml's own quantize_row_q8_K (the one its Q6_K dot product uses), unpacked for the kernel.
// Fills `q` in place: a caller that keeps it (one per thread) allocates once.
void quantize_q8k_into(Q8KRows& q, const float* hidden, int n_rows, int n_embd) {
    q.n_rows = n_rows;
    q.n_super = n_embd / 256;
    const size_t n_all = static_cast<size_t>(n_rows) * static_cast<size_t>(q.n_super);
    thread_local std::vector<Q8KBlock> blocks;
    blocks.resize(n_all);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(hidden, blocks.data(),
                                                         static_cast<int64_t>(n_all) * 256);
    q.words.resize(n_all * 64);
    q.offset.resize(n_all * 16);
    q.scale.resize(n_all);
    for (size_t rs = 0; rs < n_all; ++rs) {
        const Q8KBlock& block = blocks[rs];
        std::memcpy(&q.words[rs * 64], block.qs, 256);
        for (int j = 0; j < 16; ++j) {  // summed here: ggml leaves bsums unset for an all-zero block
            int sum = 0;
            for (int i = 0; i < 16; ++i) sum += block.qs[16 * j + i];
            q.offset[rs * 16 + static_cast<size_t>(j)] = -32 * sum;
        }
        q.scale[rs] = block.d;
    }
}

Q8KRows quantize_q8k(const float* hidden, int n_rows, int n_embd) {
    Q8KRows q;
    quantize_q8k_into(q, hidden, n_rows, n_embd);
    return q;
}

}  // namespace

void q6k_head_reference(const Q6KBlock* rows, int64_t n_vocab, int n_embd, const float* hidden, int n_rows,
                        float* logits) {
    const Q8KRows q = quantize_q8k(hidden, n_rows, n_embd);
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
struct Job;
using Run = KernelRun<Job>;  // a kernel: vocabulary groups g0 .. g1
HeadKernels<Run> kernels();
using Kernel = RunKernel<Job, Q8KRows, quantize_q8k_into, kernels>;
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
    p.run = kernels().pick("");
    p.n_super = n_embd / 256;
    p.packed = std::make_unique<HugePageBuffer>(q6k_packed_bytes(n_vocab, n_embd));
    q6k_pack(rows, n_vocab, n_embd, p.packed->data());
    p.view = q6k_view(p.packed->data(), n_vocab, n_embd);
}

Q6KHead::~Q6KHead() = default;

// ---- the kernel ----------------------------------------------------------------------------

namespace {

struct Job {
    const uint8_t* weights;
    const int8_t* scales;
    const uint16_t* d;
    int n_super;
    const Q8KRows* q;
    int64_t n_vocab;
    float* logits;
};

#ifdef LOCALSPEC_X86

#define LOCALSPEC_UNROLL _Pragma("GCC unroll 8")

// One group of 8 vocabulary rows against ROWS hidden rows (first_row ..); the group's weights
// stay in cache while the caller loops over tiles of hidden rows.
#define LOCALSPEC_Q6K_TILE(NAME, TARGET, DPBUSD)                                                      \
    template <int ROWS>                                                                              \
    __attribute__((target(TARGET))) void NAME(const Job& job, int64_t g, int first_row) {            \
        const int ns = job.n_super;                                                                  \
        const __m256i* w = reinterpret_cast<const __m256i*>(job.weights) + g * ns * 48;              \
        const int8_t* sc = job.scales + g * ns * 128;                                                \
        const uint16_t* dw = job.d + g * ns * 8;                                                     \
        const __m256i low4 = _mm256_set1_epi8(0x0F), high2 = _mm256_set1_epi8(0x30);                 \
        __m256 acc[ROWS];                                                                            \
        LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();                \
        for (int s = 0; s < ns; ++s) {                                                               \
            for (int line = 0; line < 1536; line += 64) {                                            \
                _mm_prefetch(reinterpret_cast<const char*>(w + (s + 2) * 48) + line, _MM_HINT_T0);   \
            }                                                                                        \
            __m256i isum[ROWS];                                                                      \
            LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) isum[r] = _mm256_setzero_si256();        \
            for (int j = 0; j < 16; ++j) {                                                           \
                /* 16-bit shifts move bits across bytes; the masks keep each byte's own. */          \
                const __m256i* wj = w + (s * 16 + j) * 3;                                            \
                const __m256i lo01 = _mm256_loadu_si256(wj), lo23 = _mm256_loadu_si256(wj + 1);      \
                const __m256i hi = _mm256_loadu_si256(wj + 2);                                       \
                const __m256i wk0 = _mm256_or_si256(_mm256_and_si256(lo01, low4),                    \
                                                    _mm256_and_si256(_mm256_slli_epi16(hi, 4), high2));  \
                const __m256i wk1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo01, 4), low4),  \
                                                    _mm256_and_si256(_mm256_slli_epi16(hi, 2), high2));  \
                const __m256i wk2 = _mm256_or_si256(_mm256_and_si256(lo23, low4),                    \
                                                    _mm256_and_si256(hi, high2));                    \
                const __m256i wk3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo23, 4), low4),  \
                                                    _mm256_and_si256(_mm256_srli_epi16(hi, 2), high2));  \
                const __m256i scale = _mm256_cvtepi8_epi32(                                          \
                    _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + (s * 16 + j) * 8)));       \
                LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {                                    \
                    const size_t rsj = (static_cast<size_t>(first_row + r) * ns + s) * 16 + j;       \
                    const int32_t* x = job.q->words.data() + rsj * 4;                                \
                    __m256i part = _mm256_set1_epi32(job.q->offset[rsj]);                            \
                    part = DPBUSD(part, wk0, _mm256_set1_epi32(x[0]));                               \
                    part = DPBUSD(part, wk1, _mm256_set1_epi32(x[1]));                               \
                    part = DPBUSD(part, wk2, _mm256_set1_epi32(x[2]));                               \
                    part = DPBUSD(part, wk3, _mm256_set1_epi32(x[3]));                               \
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(part, scale));            \
                }                                                                                    \
            }                                                                                        \
            const __m256 scale_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dw + s * 8)));  \
            LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {                                        \
                const float dx = job.q->scale[static_cast<size_t>(first_row + r) * ns + s];          \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]),                                \
                                         _mm256_mul_ps(scale_w, _mm256_set1_ps(dx)), acc[r]);        \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < ROWS; ++r) {                                                             \
            store_group(job.logits + static_cast<size_t>(first_row + r) * job.n_vocab + g * 8, acc[r],  \
                        job.n_vocab - g * 8);                                                        \
        }                                                                                            \
    }

LOCALSPEC_Q6K_TILE(tile_avxvnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32)
LOCALSPEC_Q6K_TILE(tile_avx2, "avx2,fma,f16c", dot_unsigned_avx2)
LOCALSPEC_Q6K_TILE(tile_avx512vnni, "avx2,fma,f16c,avx512vl,avx512vnni", _mm256_dpbusd_epi32)
#undef LOCALSPEC_Q6K_TILE

// Two neighbouring groups (16 vocabulary rows) in 512-bit registers, for tiles whose weights are
// in cache (run_tiles): one broadcast of x and one scale multiply per sub-block serve both
// groups. Each lane computes what tile_avx512vnni computes for its row, in the same order: the
// same bits.
template <int ROWS>
__attribute__((target(LOCALSPEC_AVX512_PAIR))) void pair_avx512vnni(const Job& job, int64_t g, int first_row) {
    const int ns = job.n_super;
    const __m256i* w0 = reinterpret_cast<const __m256i*>(job.weights) + g * ns * 48;
    const __m256i* w1 = w0 + static_cast<size_t>(ns) * 48;
    const int8_t* sc0 = job.scales + g * ns * 128;
    const int8_t* sc1 = sc0 + static_cast<size_t>(ns) * 128;
    const uint16_t* d0 = job.d + g * ns * 8;
    const uint16_t* d1 = d0 + static_cast<size_t>(ns) * 8;
    const __m512i low4 = _mm512_set1_epi8(0x0F), high2 = _mm512_set1_epi8(0x30);
    __m512 acc[ROWS];
    LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
    for (int s = 0; s < ns; ++s) {
        __m512i isum[ROWS];
        LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) isum[r] = _mm512_setzero_si512();
        for (int j = 0; j < 16; ++j) {
            const size_t at = static_cast<size_t>(s * 16 + j);
            const __m512i lo01 = pair_load(w0 + at * 3, w1 + at * 3), lo23 = pair_load(w0 + at * 3 + 1, w1 + at * 3 + 1);
            const __m512i hi = pair_load(w0 + at * 3 + 2, w1 + at * 3 + 2);
            const __m512i wk0 = _mm512_or_si512(_mm512_and_si512(lo01, low4),
                                                _mm512_and_si512(_mm512_slli_epi16(hi, 4), high2));
            const __m512i wk1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo01, 4), low4),
                                                _mm512_and_si512(_mm512_slli_epi16(hi, 2), high2));
            const __m512i wk2 = _mm512_or_si512(_mm512_and_si512(lo23, low4), _mm512_and_si512(hi, high2));
            const __m512i wk3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo23, 4), low4),
                                                _mm512_and_si512(_mm512_srli_epi16(hi, 2), high2));
            const __m512i scale = _mm512_cvtepi8_epi32(pair_bytes(sc0 + at * 8, sc1 + at * 8));
            LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {
                const size_t rsj = (static_cast<size_t>(first_row + r) * ns + s) * 16 + j;
                const int32_t* x = job.q->words.data() + rsj * 4;
                __m512i part = _mm512_set1_epi32(job.q->offset[rsj]);
                part = _mm512_dpbusd_epi32(part, wk0, _mm512_set1_epi32(x[0]));
                part = _mm512_dpbusd_epi32(part, wk1, _mm512_set1_epi32(x[1]));
                part = _mm512_dpbusd_epi32(part, wk2, _mm512_set1_epi32(x[2]));
                part = _mm512_dpbusd_epi32(part, wk3, _mm512_set1_epi32(x[3]));
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(part, scale));
            }
        }
        const __m512 scale_w = pair_fp16(d0 + s * 8, d1 + s * 8);
        LOCALSPEC_UNROLL for (int r = 0; r < ROWS; ++r) {
            const float dx = job.q->scale[static_cast<size_t>(first_row + r) * ns + s];
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(scale_w, _mm512_set1_ps(dx)), acc[r]);
        }
    }
    for (int r = 0; r < ROWS; ++r) {
        store_pair(job.logits + static_cast<size_t>(first_row + r) * job.n_vocab + g * 8, acc[r], job.n_vocab - g * 8);
    }
}
#undef LOCALSPEC_UNROLL

HeadKernels<Run> kernels() {
    return LOCALSPEC_TILE_KERNELS(Job);
}

#else

HeadKernels<Run> kernels() { return {}; }

#endif

}  // namespace

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
