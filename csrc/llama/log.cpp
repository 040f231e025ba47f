// llama.cpp's log, routed: errors are remembered for error messages (take_last_error), and
// everything is printed only when verbose (backend_init).
#include "llama/llama_backend.h"

#include <llama.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "llama/impl.h"

namespace localspec {

namespace {

// llama.cpp has one process-wide log callback; this sink is its user_data.
struct LogSink {
    std::mutex mutex;
    bool verbose = false;
    std::string last_error;
};

LogSink& log_sink() {
    static LogSink sink;
    return sink;
}

void on_log(ggml_log_level level, const char* text, void* user_data) {
    auto* sink = static_cast<LogSink*>(user_data);
    std::lock_guard<std::mutex> lock(sink->mutex);
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::string line(text);
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
        // The first error is the cause; later ones ("failed to load model") only summarise.
        if (!line.empty() && sink->last_error.empty()) sink->last_error = line;
    }
    if (sink->verbose) std::fputs(text, stderr);
}

}  // namespace

std::string take_last_error() {
    LogSink& sink = log_sink();
    std::lock_guard<std::mutex> lock(sink.mutex);
    std::string out;
    out.swap(sink.last_error);
    return out;
}

void backend_init(bool verbose) {
    static std::once_flag once;
    LogSink& sink = log_sink();
    {
        std::lock_guard<std::mutex> lock(sink.mutex);
        sink.verbose = sink.verbose || verbose;
    }
    std::call_once(once, [&] {
        llama_log_set(on_log, &sink);
        llama_backend_init();
    });
}

}  // namespace localspec
