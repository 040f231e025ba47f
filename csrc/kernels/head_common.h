// What localspec's output heads (q8_head.h, q6k_head.h) share: the interface the graph hook
// calls, memory in 2 MiB pages for their packed weights, and the split of a head's rows over
// llama.cpp's worker threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace localspec {

// An output head computed by localspec instead of llama.cpp: logits for rows of hidden states.
class OutputHead {
public:
    virtual ~OutputHead() = default;
    virtual const char* name() const = 0;  // "localspec-q8_0", "localspec-q6_k"
    virtual int64_t n_vocab() const = 0;
    virtual int n_embd() const = 0;
    // logits[j * n_vocab + v] = head row v . hidden row j, for j < n_rows. `kernel`: one of the
    // head's kernel names (the tests run each), "" for the fastest.
    virtual void compute(const float* hidden, int n_rows, float* logits, int n_threads,
                         const std::string& kernel = "") const = 0;
    // Whether compute_ids works: a row's logits for a few chosen tokens only, each bit-equal
    // to the same token's logit from compute().
    virtual bool computes_ids() const { return false; }
    // logits[v] = head row v . hidden (one hidden row) for each v in `ids`; the rest of
    // logits[0 .. n_vocab) is left as it was.
    virtual void compute_ids(const float* /*hidden*/, const std::vector<int32_t>& /*ids*/, float* /*logits*/) const {}
};

// Memory for packed weights, in 2 MiB pages where the kernel allows it: every call streams the
// whole head, and with 4 KiB pages the walks over ~50,000 page-table entries (evicted by the
// model's own weights between calls) cost about a tenth of a call here.
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

// Runs run(first, last) over [0, n_items) split evenly over n_threads. With OpenMP (as
// llama.cpp's CPU backend uses) the split runs on its already spinning worker threads rather
// than competing with them; otherwise on fresh threads.
void split_over_threads(int64_t n_items, int n_threads, const std::function<void(int64_t, int64_t)>& run);

// Ends the calling thread's OpenMP worker threads (omp_pause_resource_all); its next parallel
// region starts new ones. libgomp spins at a barrier only while it manages no more threads than
// the CPU has: an idle engine's kept workers (each engine thread has its own) would otherwise
// make every other engine's barriers sleep and wake (two engines on 2 cores: the busy one
// ~30% slower). A no-op without OpenMP.
void release_compute_threads();

// A kernel: output groups g0 .. g1 (8 rows each) of a Job (tiles.h).
template <typename Job>
using KernelRun = void (*)(const Job&, int64_t g0, int64_t g1);

// A tile: a kernel's computation of one group (8 output rows; two neighbouring groups for a
// pair tile) for r rows of x from first_row on.
template <typename Job>
using Tile = void (*)(const Job&, int64_t g, int first_row);

// Runs a kernel over output groups g0 .. g1 (8 rows each) and the rows of x in equal tiles of
// at most max_rows rows (9 rows: 5 + 4, not 8 + 1); singles[r - 1] computes a tile of r rows for
// one group. Groups go in blocks of kGroupBlock whose weights stay in cache while every tile
// passes over them (a prompt's hundreds of rows), and a tile's rows stay in cache over the
// block. With `pairs` (pairs[r - 1]: groups g and g + 1 at once), every tile after a block's
// first runs in pairs: the first reads the block's weights from memory, where one stream of
// single groups reads faster than a pair's two (2 threads, Gemma's head: 1-8 rows 20-40% slower
// in pairs); the tiles after it find the weights in cache, where pairs win (16 rows 13% faster,
// 64 rows 23%). The order changes no bits: each output is summed within one tile call.
constexpr int64_t kGroupBlock = 16;
template <typename Job>
void run_tiles(const Job& job, int64_t g0, int64_t g1, const Tile<Job>* singles, const Tile<Job>* pairs,
               int max_rows) {
    const int n_rows = job.q->n_rows;
    const int n_tiles = (n_rows + max_rows - 1) / max_rows;
    for (int64_t b0 = g0; b0 < g1; b0 += kGroupBlock) {
        const int64_t b1 = std::min(g1, b0 + kGroupBlock);
        for (int t = 0, j = 0; t < n_tiles; ++t) {
            const int rows = (n_rows - j) / (n_tiles - t);
            int64_t g = b0;
            if (pairs && t > 0) {
                for (; g + 1 < b1; g += 2) pairs[rows - 1](job, g, j);
            }
            for (; g < b1; ++g) singles[rows - 1](job, g, j);
            j += rows;
        }
    }
}

// run_tiles with single-group tiles TILES (of 1 .. sizeof...(TILES) rows).
template <typename Job, Tile<Job>... TILES>
void run_groups(const Job& job, int64_t g0, int64_t g1) {
    static constexpr Tile<Job> tiles[] = {TILES...};
    run_tiles<Job>(job, g0, g1, tiles, nullptr, static_cast<int>(sizeof...(TILES)));
}

// Eight pair tiles (of 1 .. 8 rows) and then eight single-group tiles, for run_group_pairs.
template <typename Job, Tile<Job> P1, Tile<Job> P2, Tile<Job> P3, Tile<Job> P4, Tile<Job> P5, Tile<Job> P6,
          Tile<Job> P7, Tile<Job> P8, Tile<Job> S1, Tile<Job> S2, Tile<Job> S3, Tile<Job> S4, Tile<Job> S5,
          Tile<Job> S6, Tile<Job> S7, Tile<Job> S8>
struct PairTiles {
    static constexpr Tile<Job> pairs[] = {P1, P2, P3, P4, P5, P6, P7, P8};
    static constexpr Tile<Job> singles[] = {S1, S2, S3, S4, S5, S6, S7, S8};
};

// run_tiles with Tiles::singles and Tiles::pairs (arrays of the same length).
template <typename Job, typename Tiles>
void run_group_pairs(const Job& job, int64_t g0, int64_t g1) {
    static_assert(std::size(Tiles::singles) == std::size(Tiles::pairs));
    run_tiles(job, g0, g1, Tiles::singles, Tiles::pairs, static_cast<int>(std::size(Tiles::pairs)));
}

// The next range of 8-row output groups [g0, g1) a thread computes; false when none is left.
// Threads that take ranges one after another balance their work (body_matmul.cpp).
using GroupRanges = std::function<bool(int64_t& g0, int64_t& g1)>;

// Calls run(g) once for each 8-row vocabulary group g that holds one of `ids` (those in
// 0 .. n_vocab-1): the groups compute_ids runs its head's kernel on.
template <typename Run>
void for_groups_of(const std::vector<int32_t>& ids, int64_t n_vocab, const Run& run) {
    std::vector<int64_t> groups;
    for (int32_t id : ids) {
        if (id >= 0 && id < n_vocab) groups.push_back(id / 8);
    }
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    for (int64_t g : groups) run(g);
}

// The x86 instruction sets both heads' kernels run on that this CPU has, fastest first:
// "avx512vnni" (AVX512-VNNI with 256-bit vectors and 32 registers), "avxvnni", and "avx2" (the
// same integer products from AVX2's byte multiply-adds, a few instructions each instead of
// one). The CPU is asked once per process.
const std::vector<std::string>& head_kernel_names();

// One head's kernel for each instruction set of head_kernel_names() (null where not compiled):
// the one registry both heads choose from, once, when the head is made.
template <typename Run>
struct HeadKernels {
    Run avx512vnni = nullptr, avxvnni = nullptr, avx2 = nullptr;

    // The kernel called `name` ("": the fastest this CPU runs), or null when this CPU cannot
    // run it.
    Run pick(const std::string& name) const {
        for (const std::string& n : head_kernel_names()) {
            if (!name.empty() && n != name) continue;
            return n == "avx512vnni" ? avx512vnni : n == "avxvnni" ? avxvnni : avx2;
        }
        return nullptr;
    }
};

// fp16 <-> fp32 as ggml converts them (round to nearest even).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

}  // namespace localspec
