// llama.cpp's RPC backend, through ggml's registry (rpc.h says why and how failures are handled).
#include "rpc.h"

#include <ggml-backend.h>
#include <ggml-rpc.h>  // the protocol version only: the functions come from the registry
#include <ggml.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "errors.h"

namespace localspec {

namespace {

constexpr int kProbeTimeoutMs = 10000;
constexpr uint8_t kHelloCommand = 14;  // RPC_CMD_HELLO: fixed in every protocol version
constexpr size_t kCapsSize = 24;       // rpc_msg_hello_req: connection capabilities (none)
constexpr size_t kHelloReplySize = 4 + kCapsSize;  // major, minor, patch, padding, caps

// Process-wide: which endpoints ggml has, which failed, and ggml's socket for each.
struct RpcState {
    std::mutex mutex;
    std::set<std::string> attached;
    std::map<std::string, std::string> failed;  // endpoint -> the sentence
    std::map<std::string, int> sockets;  // ggml's connection, once found
    std::set<std::string> stuck;  // endpoints a pass lost in the middle (rpc_failure)
};

RpcState& state() {
    static RpcState s;
    return s;
}

// Set on the threads that call into llama.cpp (the engine thread); ggml's connection threads
// never set it.
thread_local bool t_engine_thread = false;

UserError worker_error(const std::string& message) { return UserError(ErrorKind::RemoteWorker, message); }

sockaddr_in resolve(const std::string& endpoint) {
    const size_t colon = endpoint.rfind(':');
    const std::string host = endpoint.substr(0, colon);
    addrinfo hints{};
    hints.ai_family = AF_INET;  // ggml-rpc connects over IPv4
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (colon == std::string::npos || getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found) {
        throw worker_error("cannot resolve the RPC worker host '" + host + "' of --rpc " + endpoint +
                           "; give an IPv4 address or a host name this machine can resolve.");
    }
    sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
    freeaddrinfo(found);
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
    return addr;
}

bool wait_for(int fd, short events, int timeout_ms) {
    pollfd p{fd, events, 0};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & events);
}

bool send_all(int fd, const uint8_t* data, size_t n) {
    while (n > 0) {
        if (!wait_for(fd, POLLOUT, kProbeTimeoutMs)) return false;
        const ssize_t sent = send(fd, data, n, MSG_NOSIGNAL);
        if (sent <= 0) return false;
        data += sent;
        n -= static_cast<size_t>(sent);
    }
    return true;
}

bool recv_all(int fd, uint8_t* data, size_t n) {
    while (n > 0) {
        if (!wait_for(fd, POLLIN, kProbeTimeoutMs)) return false;
        const ssize_t got = recv(fd, data, n, 0);
        if (got <= 0) return false;
        data += got;
        n -= static_cast<size_t>(got);
    }
    return true;
}

struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) close(fd);
    }
};

void connect_or_throw(int fd, const sockaddr_in& addr, const std::string& endpoint) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
        err = ETIMEDOUT;
        if (wait_for(fd, POLLOUT, kProbeTimeoutMs)) {
            socklen_t len = sizeof(err);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
    }
    if (err != 0) {
        throw worker_error("cannot reach the RPC worker at " + endpoint + " (" + std::strerror(err) +
                           "); start `localspec rpc-worker` there, or fix --rpc.");
    }
}

// TCP connect + ggml's HELLO, as ggml's client does, with timeouts: ggml itself would abort.
void probe(const std::string& endpoint) {
    const sockaddr_in addr = resolve(endpoint);
    Fd sock{socket(AF_INET, SOCK_STREAM, 0)};
    connect_or_throw(sock.fd, addr, endpoint);
    uint8_t hello[1 + 8 + kCapsSize] = {kHelloCommand};
    const uint64_t size = kCapsSize;
    std::memcpy(hello + 1, &size, sizeof(size));
    uint64_t reply_size = 0;
    uint8_t reply[kHelloReplySize] = {};
    const bool answered = send_all(sock.fd, hello, sizeof(hello)) &&
                          recv_all(sock.fd, reinterpret_cast<uint8_t*>(&reply_size), sizeof(reply_size)) &&
                          reply_size == kHelloReplySize && recv_all(sock.fd, reply, sizeof(reply));
    if (!answered) {
        throw worker_error("the RPC worker at " + endpoint + " accepted the connection but did not answer "
                           "ggml's hello in " + std::to_string(kProbeTimeoutMs / 1000) + " s; a worker "
                           "serves one client at a time: stop its other client, or check that it is a "
                           "localspec rpc-worker.");
    }
    if (reply[0] != RPC_PROTO_MAJOR_VERSION || reply[1] > RPC_PROTO_MINOR_VERSION) {
        throw worker_error("the RPC worker at " + endpoint + " speaks RPC protocol " + std::to_string(reply[0]) +
                           "." + std::to_string(reply[1]) + " but this llama.cpp speaks " +
                           std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION) +
                           "; install the same localspec and llama-cpp-python on both machines.");
    }
}

ggml_backend_reg_t rpc_registry() {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) throw UserError(ErrorKind::RpcUnavailable, rpc_install_hint());
    return reg;
}

// ggml's connection to `addr`: a socket of this process whose peer it is; -1 when none.
bool peer_is(int fd, const sockaddr_in& addr) {
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 || peer.sin_family != AF_INET) return false;
    return peer.sin_port == addr.sin_port && peer.sin_addr.s_addr == addr.sin_addr.s_addr;
}

// A silent peer (a machine that vanished) fails ggml's pending read within about half a
// minute instead of never: TCP keepalive on ggml's socket.
void keep_alive(int fd) {
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
#ifdef TCP_KEEPIDLE
    int idle = 10, interval = 5, count = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
#endif
}

int scan_for_connection(const sockaddr_in& addr) {
    const long max_fd = std::min<long>(sysconf(_SC_OPEN_MAX), 4096);
    for (int fd = 0; fd < max_fd; ++fd) {
        if (peer_is(fd, addr)) return fd;
    }
    return -1;
}

// Whether the worker closed the connection (or it broke): readable EOF or an error. Between
// passes ggml's connection carries nothing, so only a hang-up counts (data is never consumed).
bool connection_closed(int fd) {
#ifdef POLLRDHUP
    pollfd p{fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
#else
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) != 1) return false;
    char byte;
    return (p.revents & (POLLHUP | POLLERR)) || recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
#endif
}

std::string lost_message(const std::string& endpoint) {
    return "the RPC worker at " + endpoint + " closed its connection (it stopped or crashed); restart "
           "`localspec rpc-worker` there, then restart this localspec to load the model again.";
}

// Whether ggml's connection to `endpoint` was closed or reset by the worker. The socket found
// last time is asked first: once reset it no longer names its peer, but ggml still holds it.
bool connection_lost(RpcState& s, const std::string& endpoint) {
    const sockaddr_in addr = resolve(endpoint);
    auto cached = s.sockets.find(endpoint);
    if (cached != s.sockets.end()) {
        const int fd = cached->second;
        sockaddr_in peer{};
        socklen_t len = sizeof(peer);
        if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 && errno == ENOTCONN) return true;
        if (peer_is(fd, addr)) return connection_closed(fd);
        s.sockets.erase(cached);
    }
    const int fd = scan_for_connection(addr);
    if (fd < 0) return false;  // no connection now (no model on it): nothing to lose
    keep_alive(fd);
    s.sockets[endpoint] = fd;
    return connection_closed(fd);
}

// The endpoints whose connection is lost now; each is marked failed.
std::vector<std::string> mark_closed(RpcState& s) {
    std::vector<std::string> lost;
    for (const std::string& endpoint : s.attached) {
        if (connection_lost(s, endpoint)) {
            s.failed.emplace(endpoint, lost_message(endpoint));
            lost.push_back(endpoint);
        }
    }
    return lost;
}

// ggml's abort: a lost worker in the middle of a pass parks ggml's connection thread (the pass
// never completes, the process lives on); any other abort is printed and happens.
void on_ggml_abort(const char* message) {
    const bool rpc = message && std::strstr(message, "RPC") != nullptr;
    if (rpc && !t_engine_thread) {
        RpcState& s = state();
        {
            std::lock_guard<std::mutex> lock(s.mutex);
            std::vector<std::string> lost = mark_closed(s);
            if (lost.empty()) {  // not told which: every worker of this process is suspect
                lost.assign(s.attached.begin(), s.attached.end());
                for (const std::string& endpoint : lost) {
                    s.failed.emplace(endpoint, "the connection to the RPC worker at " + endpoint +
                                                   " failed in the middle of a pass; restart the worker, "
                                                   "then this localspec.");
                }
            }
            s.stuck.insert(lost.begin(), lost.end());
            std::fprintf(stderr, "localspec: error: %s\n", s.failed[lost.front()].c_str());
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

std::vector<ggml_backend_device*> attach_rpc(const std::vector<std::string>& endpoints) {
    t_engine_thread = true;
    ggml_backend_reg_t reg = rpc_registry();
    using AddServer = ggml_backend_reg_t (*)(const char*);
    auto add_server = reinterpret_cast<AddServer>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server"));
    if (!add_server) throw UserError(ErrorKind::RpcUnavailable, rpc_install_hint());
    static std::once_flag once;
    std::call_once(once, [] { ggml_set_abort_callback(on_ggml_abort); });
    std::vector<ggml_backend_device*> devices;
    RpcState& s = state();
    for (const std::string& endpoint : endpoints) {
        {
            std::lock_guard<std::mutex> lock(s.mutex);
            auto failed = s.failed.find(endpoint);
            if (failed != s.failed.end()) throw worker_error(failed->second);
        }
        probe(endpoint);
        ggml_backend_reg_t server = add_server(endpoint.c_str());
        if (!server || ggml_backend_reg_dev_count(server) == 0) {
            throw worker_error("the RPC worker at " + endpoint + " lends no device; start it with a --device it has.");
        }
        for (size_t i = 0; i < ggml_backend_reg_dev_count(server); ++i) devices.push_back(ggml_backend_reg_dev_get(server, i));
        std::lock_guard<std::mutex> lock(s.mutex);
        s.attached.insert(endpoint);
    }
    return devices;
}

std::vector<RemoteDeviceInfo> remote_devices(const std::vector<std::string>& endpoints) {
    std::vector<RemoteDeviceInfo> out;
    for (const std::string& endpoint : endpoints) {
        for (ggml_backend_dev_t dev : attach_rpc({endpoint})) {
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

void check_rpc_alive(const std::vector<std::string>& endpoints) {
    if (endpoints.empty()) return;
    t_engine_thread = true;
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& endpoint : endpoints) {
        auto failed = s.failed.find(endpoint);
        if (failed != s.failed.end()) throw worker_error(failed->second);
        if (connection_lost(s, endpoint)) {
            s.failed.emplace(endpoint, lost_message(endpoint));
            throw worker_error(lost_message(endpoint));
        }
    }
}

bool rpc_failed(const std::vector<std::string>& endpoints) {
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& endpoint : endpoints) {
        if (s.failed.count(endpoint)) return true;
    }
    return false;
}

std::string rpc_failure(const std::vector<std::string>& endpoints) {
    RpcState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const std::string& endpoint : endpoints) {
        if (s.stuck.count(endpoint)) return s.failed[endpoint];
    }
    return "";
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
