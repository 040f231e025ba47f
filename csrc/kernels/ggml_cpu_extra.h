// ggml's internal interfaces for an extra CPU buffer type (body_matmul.cpp plugs into them).
//
// An extra buffer type is ggml's own plug-in point, but its interfaces live in internal headers
// that llama-cpp-python does not install. These declarations mirror them as the pinned
// llama-cpp-python 0.3.36 (ggml 0.25.3) defines them: ggml/src/ggml-backend-impl.h (buffer and
// buffer type), ggml/src/ggml-cpu/ggml-cpu-impl.h (compute params), ggml/src/ggml-cpu/traits.h
// (the two classes and the list of extra buffer types, all exported by libggml-cpu).
#pragma once

#include <ggml-backend.h>
#include <ggml.h>

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" {
struct ggml_backend_buffer_type_i {
    const char* (*get_name)(ggml_backend_buffer_type_t buft);
    ggml_backend_buffer_t (*alloc_buffer)(ggml_backend_buffer_type_t buft, size_t size);
    size_t (*get_alignment)(ggml_backend_buffer_type_t buft);
    size_t (*get_max_size)(ggml_backend_buffer_type_t buft);
    size_t (*get_alloc_size)(ggml_backend_buffer_type_t buft, const struct ggml_tensor* tensor);
    bool (*is_host)(ggml_backend_buffer_type_t buft);
};

struct ggml_backend_buffer_type {
    struct ggml_backend_buffer_type_i iface;
    ggml_backend_dev_t device;
    void* context;
};

struct ggml_backend_buffer_i {
    void (*free_buffer)(ggml_backend_buffer_t buffer);
    void* (*get_base)(ggml_backend_buffer_t buffer);
    enum ggml_status (*init_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor* tensor);
    void (*memset_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor* tensor, uint8_t value, size_t offset,
                          size_t size);
    void (*set_tensor)(ggml_backend_buffer_t buffer, struct ggml_tensor* tensor, const void* data, size_t offset,
                       size_t size);
    void (*get_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor* tensor, void* data, size_t offset,
                       size_t size);
    void (*set_tensor_2d)(ggml_backend_buffer_t, struct ggml_tensor*, const void*, size_t, size_t, size_t, size_t,
                          size_t);
    void (*get_tensor_2d)(ggml_backend_buffer_t, const struct ggml_tensor*, void*, size_t, size_t, size_t, size_t,
                          size_t);
    bool (*cpy_tensor)(ggml_backend_buffer_t buffer, const struct ggml_tensor* src, struct ggml_tensor* dst);
    void (*clear)(ggml_backend_buffer_t buffer, uint8_t value);
    void (*reset)(ggml_backend_buffer_t buffer);
};

struct ggml_backend_buffer {
    struct ggml_backend_buffer_i iface;
    ggml_backend_buffer_type_t buft;
    void* context;
    size_t size;
    enum ggml_backend_buffer_usage usage;
};

// The CPU backend's thread pool: a barrier and a shared work counter (exported by libggml-cpu).
struct ggml_threadpool;
void ggml_barrier(struct ggml_threadpool* tp);
void ggml_threadpool_chunk_set(struct ggml_threadpool* tp, int value);
int ggml_threadpool_chunk_add(struct ggml_threadpool* tp, int value);

struct ggml_compute_params {
    int ith, nth;  // this thread, of how many
    size_t wsize;
    void* wdata;
    struct ggml_threadpool* threadpool;
    bool use_ref;
};
}

namespace ggml::cpu {
class tensor_traits {
public:
    virtual ~tensor_traits();
    virtual bool work_size(int n_threads, const struct ggml_tensor* op, size_t& size) = 0;
    virtual bool compute_forward(struct ggml_compute_params* params, struct ggml_tensor* op) = 0;
};

class extra_buffer_type {
public:
    virtual ~extra_buffer_type();
    virtual bool supports_op(ggml_backend_dev_t dev, const struct ggml_tensor* op) = 0;
    virtual tensor_traits* get_tensor_traits(const struct ggml_tensor* op) = 0;
};
}  // namespace ggml::cpu

std::vector<ggml_backend_buffer_type_t>& ggml_backend_cpu_get_extra_buffer_types();
