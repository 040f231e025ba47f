// llama.cpp's RPC backend, through ggml's registry (rpc.h says why and how failures are handled).
#include "rpc/rpc.h"

#include <ggml-backend.h>  // the RPC functions come from the registry
#include <ggml.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/errors.h"
#include "rpc/rpc_socket.h"

namespace localspec {

namespace {

// Process-wide: which connections are in use, which failed, and ggml's socket for each. ggml
// keys its connections and devices by the endpoint's text and keeps them while a model holds
// them; a model on a failed worker is never freed, so a reconnect hands ggml a new spelling of
// the same endpoint (the port with one more leading zero: `connection_name`) and ggml connects
// anew.
struct RpcState {
    std::mutex mutex;
    std::map<std::string, int> generation;  // endpoint -> reconnects so far
    std::map<std::string, int> users;  // connection name -> loads and models on it now
    std::map<std::string, std::string> failed;  // connection name -> the sentence
    std::map<std::string, Socket> sockets;  // ggml's connection, once found
    std::set<std::string> stuck;  // connections a pass lost in the middle (rpc_failure)
    std::set<ino_t> retired;  // sockets of connections a reconnect replaced (kept open by ggml)
};

RpcState& state() {
    static RpcState s;
    return s;
}

// HOST:PORT as ggml knows it in `generation`: HOST:0..0PORT (ggml reads the port with stoi).
std::string connection_name(const std::string& endpoint, int generation) {
    const size_t colon = endpoint.rfind(':');
    return endpoint.substr(0, colon + 1) + std::string(static_cast<size_t>(generation), '0') + endpoint.substr(colon + 1);
}

// The endpoint a connection name spells, as the user wrote it (leading zeros of the port off).
std::string shown(const std::string& connection) {
    const size_t colon = connection.rfind(':');
    const size_t digits = connection.find_first_not_of('0', colon + 1);
    return connection.substr(0, colon + 1) + connection.substr(digits == std::string::npos ? connection.size() : digits);
}

std::string current_name(RpcState& s, const std::string& endpoint) {
    return connection_name(endpoint, s.generation[endpoint]);
}

// Set on the threads that call into llama.cpp (the engine thread); ggml's connection threads
// never set it.
thread_local bool t_engine_thread = false;
// The connections the engine thread attached last (the load it runs).
thread_local std::vector<std::string> t_loading;

ggml_backend_reg_t rpc_registry() {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) throw UserError(ErrorKind::RpcUnavailable, rpc_install_hint());
    return reg;
}

// The socket found earlier for `connection`, if its descriptor still is that socket (fd -1
// otherwise; a stale entry is forgotten).
Socket known_socket(RpcState& s, const std::string& connection) {
    auto cached = s.sockets.find(connection);
    if (cached == s.sockets.end()) return {};
    if (socket_inode(cached->second.fd) == cached->second.inode) return cached->second;
    s.sockets.erase(cached);
    return {};
}

std::string lost_message(const std::string& connection) {
    return "the RPC worker at " + shown(connection) + " closed its connection (it stopped or crashed); restart "
           "`localspec rpc-worker` there (a server loads the model again at the next request once it answers).";
}

// What a look at ggml's connection finds: a socket connected to the worker, one the worker
// closed or reset, or none (no model on it, or a socket reset before it was ever seen: once
// reset, a socket no longer names its peer).
enum class Link { Open, Lost, Unseen };

// ggml's connection to `connection` now. The socket found last time is asked first (by inode:
// its descriptor may be another socket now); a reset one no longer names its peer, but ggml
// still holds it.
Link look_at(RpcState& s, const std::string& connection) {
    const sockaddr_in addr = resolve(connection);
    const Socket known = known_socket(s, connection);
    if (known.fd >= 0) {
        sockaddr_in peer{};
        socklen_t len = sizeof(peer);
        if (getpeername(known.fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 && errno == ENOTCONN) return Link::Lost;
        if (peer_is(known.fd, addr)) return connection_closed(known.fd) ? Link::Lost : Link::Open;
        s.sockets.erase(connection);
    }
    const Socket found = scan_for_connection(addr, s.retired);
    if (found.fd < 0) return Link::Unseen;
    keep_alive(found.fd);
    s.sockets[connection] = found;
    return connection_closed(found.fd) ? Link::Lost : Link::Open;
}

bool connection_lost(RpcState& s, const std::string& connection) { return look_at(s, connection) == Link::Lost; }

// Hang up ggml's connection of `connection` (a reconnect replaces it) and never look at it again.
void retire(RpcState& s, const std::string& connection) {
    const sockaddr_in addr = resolve(connection);
    Socket socket = known_socket(s, connection);
    if (socket.fd < 0) socket = scan_for_connection(addr, s.retired);
    if (socket.fd >= 0 && peer_is(socket.fd, addr)) shutdown(socket.fd, SHUT_RDWR);
    if (socket.fd >= 0) s.retired.insert(socket.inode);
    s.sockets.erase(connection);
}

bool in_use(RpcState& s, const std::string& connection) {
    auto users = s.users.find(connection);
    return users != s.users.end() && users->second > 0;
}

// The connections in use that have not failed yet (those of freed models are not in use: a
// worker stopped after its model was freed, or the socket number ggml reuses, is no loss).
std::vector<std::string> live_connections(RpcState& s) {
    std::vector<std::string> live;
    for (const auto& [connection, users] : s.users) {
        if (users > 0 && !s.failed.count(connection)) live.push_back(connection);
    }
    return live;
}

// After ggml's connection thread reported a broken link: the live connections it may have
// been, each marked failed. Those closed or reset by their worker; when none is seen lost, the
// ones without a socket connected to their worker (reset before they were seen); when every
// one looks open, all of them (ggml did not say which).
std::vector<std::string> mark_broken(RpcState& s) {
    std::vector<std::string> lost, unseen, live = live_connections(s);
    for (const std::string& connection : live) {
        const Link link = look_at(s, connection);
        if (link == Link::Lost) lost.push_back(connection);
        if (link == Link::Unseen) unseen.push_back(connection);
    }
    const bool seen = !lost.empty();
    const std::vector<std::string>& broken = seen ? lost : !unseen.empty() ? unseen : live;
    for (const std::string& connection : broken) {
        s.failed.emplace(connection, seen ? lost_message(connection) :
                         "the connection to the RPC worker at " + shown(connection) + " broke (the worker "
                         "stopped, crashed or became unreachable); restart `localspec rpc-worker` there (a "
                         "server loads the model again at the next request once it answers).");
    }
    return broken;
}

// The connections of the engine thread's load that an abort message of ggml-rpc names ("Failed
// to connect to HOST:PORT"); all of them when it names none.
std::vector<std::string> named_in(const char* message) {
    std::vector<std::string> named;
    for (const std::string& connection : t_loading) {
        if (std::strstr(message, (connection + "\n").c_str()) || std::strstr(message, (connection + " ").c_str())) {
            named.push_back(connection);
        }
    }
    return named.empty() ? t_loading : named;
}

// On the engine thread (connecting while a model loads): the connection is marked failed and
// the abort becomes a UserError, which llama.cpp's loader catches like any load error.
[[noreturn]] void throw_on_engine_thread(const char* message) {
    RpcState& s = state();
    std::string sentence;
    {
        std::lock_guard<std::mutex> lock(s.mutex);
        std::vector<std::string> named = named_in(message);
        std::string which;
        for (const std::string& connection : named) which += (which.empty() ? "" : ", ") + shown(connection);
        sentence = "the RPC worker at " + which + " stopped answering while the model loaded; restart "
                   "`localspec rpc-worker` there and load again.";
        for (const std::string& connection : named) s.failed.emplace(connection, sentence);
    }
    throw worker_error(sentence);
}

// ggml's abort: a lost worker in the middle of a pass parks ggml's connection thread (the pass
// never completes, the process lives on); on the engine thread it throws; any other abort is
// printed and happens.
void on_ggml_abort(const char* message) {
    const bool rpc = message && (std::strstr(message, "ggml-rpc") != nullptr || std::strstr(message, "RPC") != nullptr);
    if (rpc && t_engine_thread && std::uncaught_exceptions() == 0) throw_on_engine_thread(message);
    if (rpc && !t_engine_thread) {
        RpcState& s = state();
        {
            std::lock_guard<std::mutex> lock(s.mutex);
            const std::vector<std::string> lost = mark_broken(s);
            s.stuck.insert(lost.begin(), lost.end());  // the engine's watcher reports it
        }
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    std::fprintf(stderr, "%s\n", message ? message : "ggml aborted");
    if (rpc) std::fprintf(stderr, "localspec: error: lost the connection to an RPC worker; the process stops.\n");
}

}  // namespace

bool rpc_supported() { return ggml_backend_reg_by_name("RPC") != nullptr; }

std::string rpc_install_hint() {
    return "this llama-cpp-python build has no RPC backend; install one with it: CMAKE_ARGS=\"-DGGML_RPC=on\" "
           "pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36 "
           "(README, \"Install variants\").";
}

namespace {

using AddServer = ggml_backend_reg_t (*)(const char*);

// Probe `endpoint`, mark its current connection in use (before ggml connects: a broken link
// then is blamed on it) and hand it to ggml; its devices are added to `attachment`.
void attach_one(AddServer add_server, const std::string& endpoint, RpcAttachment& attachment) {
    RpcState& s = state();
    std::string connection;
    {
        std::lock_guard<std::mutex> lock(s.mutex);
        connection = current_name(s, endpoint);
        auto failed = s.failed.find(connection);
        if (failed != s.failed.end()) throw worker_error(failed->second);
    }
    probe(endpoint);
    {
        std::lock_guard<std::mutex> lock(s.mutex);
        ++s.users[connection];
    }
    attachment.connections.push_back(connection);
    ggml_backend_reg_t server = add_server(connection.c_str());
    if (!server || ggml_backend_reg_dev_count(server) == 0) {
        throw worker_error("the RPC worker at " + endpoint + " lends no device; start it with a --device it has.");
    }
    for (size_t i = 0; i < ggml_backend_reg_dev_count(server); ++i) {
        attachment.devices.push_back(ggml_backend_reg_dev_get(server, i));
    }
}

}  // namespace

RpcAttachment attach_rpc(const std::vector<std::string>& endpoints) {
    t_engine_thread = true;
    ggml_backend_reg_t reg = rpc_registry();
    auto add_server = reinterpret_cast<AddServer>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server"));
    if (!add_server) throw UserError(ErrorKind::RpcUnavailable, rpc_install_hint());
    static std::once_flag once;
    std::call_once(once, [] { ggml_set_abort_callback(on_ggml_abort); });
    rpc_reconnect(endpoints);  // a worker that failed before and answers again: connect anew
    RpcState& s = state();
    t_loading.clear();
    {
        std::lock_guard<std::mutex> lock(s.mutex);
        for (const std::string& endpoint : endpoints) t_loading.push_back(current_name(s, endpoint));
    }
    RpcAttachment attachment;
    try {
        for (const std::string& endpoint : endpoints) attach_one(add_server, endpoint, attachment);
    } catch (...) {
        release_rpc(attachment.connections);  // nothing stays in use after a failed attach
        throw;
    }
    return attachment;
}

void release_rpc(const std::vector<std::string>& connections) {
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& connection : connections) {
        auto users = s.users.find(connection);
        if (users == s.users.end() || --users->second > 0) continue;
        s.users.erase(users);
        s.sockets.erase(connection);  // ggml closes its socket with the last model on it
    }
}

std::vector<RemoteDeviceInfo> remote_devices(const std::vector<std::string>& endpoints) {
    std::vector<RemoteDeviceInfo> out;
    for (const std::string& endpoint : endpoints) {
        const RpcAttachment attachment = attach_rpc({endpoint});
        struct Release {
            const std::vector<std::string>& connections;
            ~Release() { release_rpc(connections); }
        } release{attachment.connections};
        for (ggml_backend_dev_t dev : attachment.devices) {
            RemoteDeviceInfo info;
            info.endpoint = endpoint;
            info.name = ggml_backend_dev_name(dev);
            size_t free = 0, total = 0;
            ggml_backend_dev_memory(dev, &free, &total);
            info.free_bytes = free;
            info.total_bytes = total;
            out.push_back(std::move(info));
        }
    }
    return out;
}

void check_rpc_alive(const std::vector<std::string>& connections) {
    if (connections.empty()) return;
    t_engine_thread = true;
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& connection : connections) {
        auto failed = s.failed.find(connection);
        if (failed != s.failed.end()) throw worker_error(failed->second);
        if (connection_lost(s, connection)) {
            s.failed.emplace(connection, lost_message(connection));
            throw worker_error(lost_message(connection));
        }
    }
}

bool rpc_failed(const std::vector<std::string>& connections) {
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& connection : connections) {
        if (s.failed.count(connection)) return true;
    }
    return false;
}

std::string rpc_failure(const std::vector<std::string>& endpoints) {
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& endpoint : endpoints) {
        const std::string connection = current_name(s, endpoint);
        if (s.stuck.count(connection)) return s.failed[connection];
    }
    return "";
}

std::string rpc_lost(const std::vector<std::string>& endpoints) {
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& endpoint : endpoints) {
        const std::string connection = current_name(s, endpoint);
        if (!s.failed.count(connection) && in_use(s, connection) && connection_lost(s, connection)) {
            s.failed.emplace(connection, lost_message(connection));
        }
        auto failed = s.failed.find(connection);
        if (failed != s.failed.end()) return failed->second;
    }
    return "";
}

void rpc_reconnect(const std::vector<std::string>& endpoints) {
    RpcState& s = state();
    {
        std::lock_guard<std::mutex> lock(s.mutex);
        bool any_failed = false;
        for (const std::string& endpoint : endpoints) any_failed = any_failed || s.failed.count(current_name(s, endpoint));
        if (!any_failed) return;
        // This generation's models are left as they are, never freed: mark every connection of
        // theirs failed, and hang up the ones still open (a worker serves one client at a time).
        for (const std::string& endpoint : endpoints) {
            const std::string connection = current_name(s, endpoint);
            s.failed.emplace(connection, lost_message(connection));
            retire(s, connection);
        }
    }
    for (const std::string& endpoint : endpoints) probe(endpoint);
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& endpoint : endpoints) ++s.generation[endpoint];
}

std::vector<std::string> default_worker_devices() {
    std::vector<std::string> gpus;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            gpus.push_back(ggml_backend_dev_name(dev));
        }
    }
    if (gpus.empty()) gpus.push_back(ggml_backend_dev_name(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)));
    return gpus;
}

void serve_rpc_worker(const std::string& endpoint, const std::vector<std::string>& names, int n_threads) {
    ggml_backend_reg_t reg = rpc_registry();
    using StartServer = void (*)(const char*, const char*, size_t, size_t, ggml_backend_dev_t*);
    auto start = reinterpret_cast<StartServer>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_start_server"));
    if (!start) throw UserError(ErrorKind::RpcUnavailable, rpc_install_hint());
    std::vector<ggml_backend_dev_t> devices;
    for (const std::string& name : names.empty() ? default_worker_devices() : names) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (!dev) {
            std::string known;
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) known += std::string(known.empty() ? "" : ", ") + ggml_backend_dev_name(ggml_backend_dev_get(i));
            throw UserError(ErrorKind::InvalidParameter, "this machine has no device '" + name + "'; use one of: " + known + ".");
        }
        devices.push_back(dev);
    }
    start(endpoint.c_str(), nullptr, static_cast<size_t>(n_threads), devices.size(), devices.data());
    throw worker_error("the RPC worker could not listen on " + endpoint + " (is the port in use?); pick another --port.");
}

}  // namespace localspec
