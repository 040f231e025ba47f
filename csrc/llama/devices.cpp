// The compute devices ggml's backend registry reports (the memory planner's input). Uses
// ggml-backend.h only, not llama.h.
#include <ggml-backend.h>

#include "llama/llama_backend.h"

namespace localspec {

std::vector<DeviceInfo> list_devices() {
    std::vector<DeviceInfo> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        DeviceInfo info;
        info.name = ggml_backend_dev_name(dev);
        info.description = ggml_backend_dev_description(dev);
        switch (ggml_backend_dev_type(dev)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU: info.kind = "cpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_GPU: info.kind = "gpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU: info.kind = "igpu"; break;
            default: info.kind = "accel"; break;
        }
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        info.free_bytes = free;
        info.total_bytes = total;
        out.push_back(std::move(info));
    }
    return out;
}

}  // namespace localspec
