// The engine's clock: durations in seconds from a steady clock.
#pragma once

#include <chrono>

namespace localspec {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace localspec
