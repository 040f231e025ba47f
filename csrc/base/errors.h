// User-facing errors raised by the core. The binding maps each kind onto the matching
// Python exception in localspec.errors; the message is one sentence for the user.
#pragma once

#include <stdexcept>
#include <string>

namespace localspec {

enum class ErrorKind { ModelLoad, VocabMismatch, PromptTooLong, InvalidParameter, RemoteWorker, RpcUnavailable };

struct UserError : std::runtime_error {
    ErrorKind kind;
    UserError(ErrorKind k, const std::string& message) : std::runtime_error(message), kind(k) {}
};

}  // namespace localspec
