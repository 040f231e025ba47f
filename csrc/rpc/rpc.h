// Target layers on other machines: llama.cpp's RPC backend (ggml-rpc), reached at run time through
// ggml's backend registry, so a llama-cpp-python build without it still loads and says what is
// missing. Plain C++ (no llama.h, no pybind11); rpc.cpp holds the sockets and ggml calls.
//
// ggml-rpc aborts the process when a worker's connection fails. localspec therefore
//  - probes every endpoint itself (TCP connect + ggml's HELLO, with a timeout) before ggml sees it;
//  - checks ggml's connection before every target pass (check_rpc_alive): a worker that closed
//    it is a UserError(RemoteWorker), and nothing of that model is freed afterwards (freeing
//    talks to the worker);
//  - installs ggml's abort callback: a connection lost in the middle of a pass parks ggml's
//    connection thread instead of aborting (the pass never ends; rpc_failure() says why, and the
//    Python engine fails its requests); a connection that fails on the engine thread (ggml
//    connecting while a model loads) becomes a UserError(RemoteWorker) there;
//  - reconnects after a failure (rpc_reconnect): the failed generation's models stay allocated,
//    and ggml gets a new spelling of each endpoint, so it opens new connections.
// ggml's connections are named by "connection names" (HOST:0..0PORT, RpcAttachment); the
// functions that take `connections` want those, the others the endpoints as the user wrote them.
// A connection is in use from attach_rpc until release_rpc (its model was freed or given up):
// only those are supervised and blamed when ggml reports a broken link.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct ggml_backend_device;

namespace localspec {

// Whether the loaded ggml has the RPC backend.
bool rpc_supported();
// The one sentence saying how to install a build with it.
std::string rpc_install_hint();

// A device a worker lends (ggml's memory report through the RPC protocol).
struct RemoteDeviceInfo {
    std::string endpoint;  // HOST:PORT
    std::string name;  // ggml's name: RPC0, RPC1, ... in the order they were added
    uint64_t free_bytes = 0, total_bytes = 0;
};

// What a load hands to llama.cpp: the workers' devices in the order of `endpoints`, and the
// names under which ggml knows the endpoints now (the model keeps them, and releases them).
struct RpcAttachment {
    std::vector<ggml_backend_device*> devices;
    std::vector<std::string> connections;
};

// Probe each endpoint, then hand it to ggml (once per process) and mark its connection in use.
// Throws UserError(RemoteWorker) for an unreachable, busy or incompatible worker, or one whose
// connection failed earlier in this process (nothing stays in use then).
RpcAttachment attach_rpc(const std::vector<std::string>& endpoints);
// The model (or question) that attach_rpc served is gone: its connections are no longer in use.
void release_rpc(const std::vector<std::string>& connections);
std::vector<RemoteDeviceInfo> remote_devices(const std::vector<std::string>& endpoints);

// Before a pass: throws UserError(RemoteWorker) when a worker closed ggml's connection (or it
// failed before). Cheap: a poll on ggml's socket.
void check_rpc_alive(const std::vector<std::string>& connections);
// Whether one of the connections failed (a model or context on it must not be freed).
bool rpc_failed(const std::vector<std::string>& connections);
// Why a pass (or a load) lost one of these workers in the middle ("" when none did): it never
// returns.
std::string rpc_failure(const std::vector<std::string>& endpoints);
// Why one of these workers' current connections failed or was closed by the worker ("" when
// none): a supervisor's poll, for a loaded model (a poll on ggml's socket, no traffic).
std::string rpc_lost(const std::vector<std::string>& endpoints);
// After a failure: hang up the failed generation's connections (its models are never freed),
// probe every worker (throws UserError(RemoteWorker) while one does not answer) and let the next
// attach_rpc connect anew. Does nothing when no connection of these endpoints failed.
void rpc_reconnect(const std::vector<std::string>& endpoints);

// Serve this machine's devices (ggml names; empty: the GPUs, else the CPU) at HOST:PORT until
// the process ends. Throws UserError(InvalidParameter) for an unknown device.
void serve_rpc_worker(const std::string& endpoint, const std::vector<std::string>& devices, int n_threads);
// The devices serve_rpc_worker would serve by default (names), for its banner.
std::vector<std::string> default_worker_devices();

}  // namespace localspec
