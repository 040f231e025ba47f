#include "kernels/body_matmul.h"

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/ggml_cpu_extra.h"
#include "kernels/q4k_matmul.h"
#include "kernels/q6k_head.h"
#include "kernels/q8_head.h"

// ---- localspec's buffer type -----------------------------------------------------------------

namespace localspec {

namespace {

std::atomic<int> claimed{0};  // a BodyKernelClaim::Scope while a claim is alive, else 0
std::atomic<long> tensors{0};

// Weights the int8 kernel takes: each value is an integer times its block's fp16 scale, so
// widening the integers to int8 loses nothing.
bool widens_to_int8(ggml_type type) {
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q4_0;
}

// The widened types whose values lie within -16..15 (Q5_0: -16..15, Q4_0: -8..7; widen_block):
// Q8PackedMatrix::small.
bool widens_within_16(ggml_type type) {
    return type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q4_0;
}

// How a weight in this buffer type is held and multiplied: widened to int8 for the Q8_0 head's
// kernel (q8_head.h); packed for localspec's Q4_K kernel (q4k_matmul.h) or the Q6_K head's
// (q6k_head.h, 6 bits a value as in the file), whole super-blocks only; or in ggml's own layout for
// its one-row dot product.
enum class Layout { Int8, Q4K, Q6K, File };

Layout layout_of(const ggml_tensor* w) {
    if (widens_to_int8(w->type)) return Layout::Int8;
    if (w->type == GGML_TYPE_Q4_K && w->ne[0] % 256 == 0 && q4k_matmul_supported()) return Layout::Q4K;
    if (w->type == GGML_TYPE_Q6_K && w->ne[0] % 256 == 0 && int8_kernels_supported()) return Layout::Q6K;
    return Layout::File;
}

// The types default mode takes (body_matmul.h, faster_body_types()). Q4_0 has a kernel too
// (widened to int8, 34 bytes a block against 18), which only exact mode uses.
std::vector<ggml_type> faster_types() {
    return {GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K};
}

bool is_faster(ggml_type type) {
    static const std::vector<ggml_type> faster = faster_types();
    return std::find(faster.begin(), faster.end(), type) != faster.end();
}

// Weights computed with ggml's one-row dot product (any quantized type that has one).
bool has_vec_dot(ggml_type type) {
    const ggml_type_traits_cpu* traits = ggml_get_type_traits_cpu(type);
    return ggml_is_quantized(type) && traits->vec_dot && ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float;
}

// One block's 32 values as ggml's Q8_0 block (integers and scale unchanged).
Q8Block widen_block(ggml_type type, const uint8_t* block) {
    Q8Block out;
    std::memcpy(&out.d, block, 2);
    if (type == GGML_TYPE_Q8_0) {
        std::memcpy(out.qs, block + 2, 32);
        return out;
    }
    const uint8_t* qh = block + 2;  // Q5_0: 32 fifth bits, then the nibbles
    const uint8_t* qs = block + (type == GGML_TYPE_Q5_0 ? 6 : 2);
    uint32_t high = 0;
    if (type == GGML_TYPE_Q5_0) std::memcpy(&high, qh, 4);
    const int bias = type == GGML_TYPE_Q5_0 ? 16 : 8;
    for (int i = 0; i < 16; ++i) {  // value i in the low nibbles, value i + 16 in the high ones
        const int lo = (qs[i] & 0x0F) | static_cast<int>(((high >> i) & 1u) << 4);
        const int hi = (qs[i] >> 4) | static_cast<int>(((high >> (i + 16)) & 1u) << 4);
        out.qs[i] = static_cast<int8_t>(lo - bias);
        out.qs[i + 16] = static_cast<int8_t>(hi - bias);
    }
    return out;
}

Q8PackedMatrix packed_view(const ggml_tensor* w) {
    const int64_t n_out = w->ne[1];
    const int n_in = static_cast<int>(w->ne[0]);
    const auto* base = static_cast<const uint8_t*>(w->data);
    return {base, reinterpret_cast<const uint16_t*>(base + q8_packed_weight_bytes(n_out, n_in)), n_out, n_in,
            widens_within_16(w->type)};
}

// The x rows one after another (a view with gaps between rows is copied).
const float* contiguous_rows(const ggml_tensor* x, int64_t n_rows) {
    const size_t row_bytes = static_cast<size_t>(x->ne[0]) * sizeof(float);
    if (x->nb[1] == row_bytes && (x->ne[2] == 1 || x->nb[2] == row_bytes * static_cast<size_t>(x->ne[1])) &&
        (x->ne[3] == 1 || x->nb[3] == x->nb[2] * static_cast<size_t>(x->ne[2]))) {
        return static_cast<const float*>(x->data);
    }
    thread_local std::vector<float> copy;
    copy.resize(static_cast<size_t>(n_rows) * static_cast<size_t>(x->ne[0]));
    int64_t j = 0;
    for (int64_t i3 = 0; i3 < x->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < x->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < x->ne[1]; ++i1, ++j) {
                const char* row = static_cast<const char*>(x->data) + i1 * x->nb[1] + i2 * x->nb[2] + i3 * x->nb[3];
                std::memcpy(copy.data() + j * x->ne[0], row, row_bytes);
            }
        }
    }
    return copy.data();
}

// The rows of w in the 8-row groups `next` hands out times every x row, with ggml's one-row dot
// product.
void vec_dot_rows(const ggml_tensor* w, const float* x, int64_t n_rows, float* out, const GroupRanges& next) {
    const ggml_type_traits_cpu* traits = ggml_get_type_traits_cpu(w->type);
    const int n_in = static_cast<int>(w->ne[0]);
    const size_t row_bytes = ggml_row_size(traits->vec_dot_type, n_in);
    thread_local std::vector<uint8_t> xq;
    xq.resize(static_cast<size_t>(n_rows) * row_bytes);
    const auto from_float = ggml_get_type_traits_cpu(traits->vec_dot_type)->from_float;
    for (int64_t j = 0; j < n_rows; ++j) from_float(x + j * n_in, xq.data() + j * row_bytes, n_in);
    const int64_t n_out = w->ne[1];
    for (int64_t g0 = 0, g1 = 0; next(g0, g1);) {
        for (int64_t o = g0 * 8; o < std::min(n_out, g1 * 8); ++o) {
            const char* row = static_cast<const char*>(w->data) + o * w->nb[1];
            for (int64_t j = 0; j < n_rows; ++j) {
                traits->vec_dot(n_in, out + j * n_out + o, 0, row, 0, xq.data() + j * row_bytes, 0, 1);
            }
        }
    }
}

// Hands the threads of one ggml op chunks of output groups, 4 per thread, each thread its own
// first and then whichever is left (ggml's threadpool counter, as its own matmuls do): a thread
// that the system holds up does not hold up the op.
GroupRanges chunks_of(ggml_compute_params* params, int64_t groups) {
    const int nth = params->nth;
    const int64_t n_chunks = std::max<int64_t>(1, std::min<int64_t>(groups, int64_t{nth} * 4));
    if (params->ith == 0) ggml_threadpool_chunk_set(params->threadpool, nth);
    ggml_barrier(params->threadpool);
    return [=, chunk = int64_t{params->ith}](int64_t& g0, int64_t& g1) mutable {
        if (chunk >= n_chunks) return false;
        g0 = groups * chunk / n_chunks;
        g1 = groups * (chunk + 1) / n_chunks;
        chunk = ggml_threadpool_chunk_add(params->threadpool, 1);
        return true;
    };
}

class BodyMatmul : public ggml::cpu::tensor_traits {
public:
    bool work_size(int, const ggml_tensor*, size_t& size) override {
        size = 0;  // each thread quantizes the x rows into its own thread-local buffer
        return true;
    }

    // Called on every ggml worker thread (params->ith of params->nth): each takes chunks of
    // whole 8-row output groups (chunks_of).
    bool compute_forward(ggml_compute_params* params, ggml_tensor* op) override {
        const ggml_tensor* w = op->src[0];
        const ggml_tensor* x = op->src[1];
        const int64_t n_rows = x->ne[1] * x->ne[2] * x->ne[3];
        const float* xs = contiguous_rows(x, n_rows);
        auto* out = static_cast<float*>(op->data);
        const int n_in = static_cast<int>(w->ne[0]);
        const auto* data = static_cast<const uint8_t*>(w->data);
        const GroupRanges next = chunks_of(params, (w->ne[1] + 7) / 8);
        switch (layout_of(w)) {
            case Layout::Int8: q8_matmul(packed_view(w), xs, static_cast<int>(n_rows), out, next); break;
            case Layout::Q4K: q4k_matmul(data, w->ne[1], n_in, xs, static_cast<int>(n_rows), out, next); break;
            case Layout::Q6K: q6k_matmul(q6k_view(data, w->ne[1], n_in), xs, static_cast<int>(n_rows), out, next); break;
            case Layout::File: vec_dot_rows(w, xs, n_rows, out, next); break;
        }
        return true;
    }
};

BodyMatmul& body_matmul() {
    static BodyMatmul matmul;
    return matmul;
}

ggml_backend_buffer_type* body_buffer_type();

class BodyBufferType : public ggml::cpu::extra_buffer_type {
public:
    bool supports_op(ggml_backend_dev_t, const ggml_tensor* op) override {
        if (op->op != GGML_OP_MUL_MAT) return false;
        const ggml_tensor* w = op->src[0];
        const ggml_tensor* x = op->src[1];
        if (x->type != GGML_TYPE_F32 || w->ne[2] != 1 || w->ne[3] != 1 || !ggml_is_contiguous(op)) return false;
        if (!widens_to_int8(w->type) && !has_vec_dot(w->type)) return false;
        // llama.cpp's loader asks with an empty buffer of this type: take the weight while a
        // claim is alive. The output head (its own tensor, or the token embeddings it is tied
        // to) stays with llama.cpp: localspec's heads read it.
        if (w->buffer && w->buffer->size == 0) {
            const int scope = claimed.load();
            const bool taken = scope == BodyKernelClaim::All || (scope == BodyKernelClaim::Faster && is_faster(w->type));
            return taken && std::strcmp(w->name, "output.weight") != 0 &&
                   std::strcmp(w->name, "token_embd.weight") != 0;
        }
        return true;
    }

    ggml::cpu::tensor_traits* get_tensor_traits(const ggml_tensor* op) override {
        const ggml_tensor* w = op->src[0];
        if (op->op == GGML_OP_MUL_MAT && w && w->buffer && w->buffer->buft == body_buffer_type()) return &body_matmul();
        return nullptr;
    }
};

void set_tensor(ggml_backend_buffer_t, ggml_tensor* tensor, const void* data, size_t offset, size_t size) {
    GGML_ASSERT(offset == 0 && size == ggml_nbytes(tensor));  // whole tensors, as llama.cpp loads them
    ++tensors;
    const int64_t n_out = tensor->ne[1];
    const int n_in = static_cast<int>(tensor->ne[0]);
    auto* base = static_cast<uint8_t*>(tensor->data);
    switch (layout_of(tensor)) {
        case Layout::Q4K: q4k_pack(static_cast<const Q4KBlock*>(data), n_out, n_in, base); return;
        case Layout::Q6K: q6k_pack(static_cast<const Q6KBlock*>(data), n_out, n_in, base); return;
        case Layout::File: std::memcpy(base, data, size); return;
        case Layout::Int8: break;
    }
    const size_t block_bytes = ggml_type_size(tensor->type);
    std::vector<Q8Block> rows(static_cast<size_t>(n_out) * static_cast<size_t>(n_in / 32));
    for (size_t b = 0; b < rows.size(); ++b) {
        rows[b] = widen_block(tensor->type, static_cast<const uint8_t*>(data) + b * block_bytes);
    }
    q8_pack(rows.data(), n_out, n_in, base, reinterpret_cast<uint16_t*>(base + q8_packed_weight_bytes(n_out, n_in)));
}

void get_tensor(ggml_backend_buffer_t, const ggml_tensor* tensor, void* data, size_t offset, size_t size) {
    GGML_ASSERT(layout_of(tensor) == Layout::File && "localspec's packed body weights cannot be read back");
    std::memcpy(data, static_cast<const char*>(tensor->data) + offset, size);
}

ggml_backend_buffer_t alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    ggml_backend_buffer_t buffer = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), size);
    if (!buffer) return nullptr;
    buffer->buft = buft;
    buffer->iface.set_tensor = set_tensor;
    buffer->iface.get_tensor = get_tensor;
    buffer->iface.set_tensor_2d = nullptr;
    buffer->iface.get_tensor_2d = nullptr;
    buffer->iface.cpy_tensor = nullptr;
    return buffer;
}

size_t alloc_size(ggml_backend_buffer_type_t, const ggml_tensor* tensor) {
    const int64_t n_out = tensor->ne[1];
    const int n_in = static_cast<int>(tensor->ne[0]);
    switch (layout_of(tensor)) {
        case Layout::Int8: return q8_packed_weight_bytes(n_out, n_in) + q8_packed_scale_bytes(n_out, n_in);
        case Layout::Q4K: return q4k_packed_bytes(n_out, n_in);
        case Layout::Q6K: return q6k_packed_bytes(n_out, n_in);
        case Layout::File: break;
    }
    return ggml_nbytes(tensor);
}

ggml_backend_buffer_type* body_buffer_type() {
    static BodyBufferType extra;
    static ggml_backend_buffer_type buft = {
        {
            [](ggml_backend_buffer_type_t) { return "localspec-body"; },
            alloc_buffer,
            [](ggml_backend_buffer_type_t) { return ggml_backend_buft_get_alignment(ggml_backend_cpu_buffer_type()); },
            nullptr,
            alloc_size,
            nullptr,
        },
        ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU),
        &extra,
    };
    return &buft;
}

// Puts the buffer type first in ggml's list of extra buffer types (before llama.cpp's repacked
// layouts, which it must beat to a claimed weight), then checks that the copy of the list
// llama.cpp's loader reads (made once, on its first request) holds it.
bool register_body_kernels() {
    if (!int8_kernels_supported()) return false;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) return false;
    std::vector<ggml_backend_buffer_type_t>& list = ggml_backend_cpu_get_extra_buffer_types();
    list.insert(list.begin(), body_buffer_type());
    const auto offered = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu), "ggml_backend_dev_get_extra_bufts"));
    for (ggml_backend_buffer_type_t* b = offered ? offered(cpu) : nullptr; b && *b; ++b) {
        if (*b == body_buffer_type()) return true;
    }
    list.erase(std::find(list.begin(), list.end(), body_buffer_type()));
    return false;
}

}  // namespace

bool body_kernels_available() {
    static const bool available = register_body_kernels();
    return available;
}

std::vector<std::string> faster_body_types() {
    std::vector<std::string> out;
    for (ggml_type type : faster_types()) {
        std::string name = ggml_type_name(type);  // "q4_K": GGUF's spelling is "Q4_K"
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
        out.push_back(name);
    }
    return out;
}

BodyKernelClaim::BodyKernelClaim(Scope scope) { claimed = scope; }
BodyKernelClaim::~BodyKernelClaim() { claimed = 0; }

long body_kernel_tensors() { return tensors.load(); }

std::vector<float> body_matmul_via_ggml(const std::string& type_name, const std::vector<uint8_t>& weights,
                                        int64_t n_out, int n_in, const std::vector<float>& x, int n_threads,
                                        bool localspec_buffer, int repeat) {
    ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char* name = ggml_type_name(static_cast<ggml_type>(t));
        if (name && type_name == name) type = static_cast<ggml_type>(t);
    }
    if (type == GGML_TYPE_COUNT) throw std::invalid_argument("no ggml type named " + type_name);
    const int64_t n_rows = static_cast<int64_t>(x.size()) / n_in;
    if (localspec_buffer && !body_kernels_available()) throw std::runtime_error("localspec's body kernels are unavailable");
    ggml_init_params params{ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    ggml_context* weight_ctx = ggml_init(params);
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* w = ggml_new_tensor_2d(weight_ctx, type, n_in, n_out);
    if (weights.size() != ggml_nbytes(w)) throw std::invalid_argument("the weights hold the wrong number of bytes");
    ggml_tensor* xs = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_in, n_rows);
    ggml_tensor* y = ggml_mul_mat(ctx, w, xs);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, y);
    ggml_backend_buffer_t weight_buffer = ggml_backend_alloc_ctx_tensors_from_buft(
        weight_ctx, localspec_buffer ? body_buffer_type() : ggml_backend_cpu_buffer_type());
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(w, weights.data(), 0, weights.size());
    ggml_backend_tensor_set(xs, x.data(), 0, x.size() * sizeof(float));
    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, n_threads);
    for (int i = 0; i < std::max(1, repeat); ++i) ggml_backend_graph_compute(backend, graph);
    std::vector<float> out(static_cast<size_t>(n_out * n_rows));
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    ggml_backend_free(backend);
    ggml_backend_buffer_free(buffer);
    ggml_backend_buffer_free(weight_buffer);
    ggml_free(ctx);
    ggml_free(weight_ctx);
    return out;
}

}  // namespace localspec
