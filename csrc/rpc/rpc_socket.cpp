#include "rpc/rpc_socket.h"

#include <ggml-rpc.h>  // the protocol version

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/errors.h"

namespace localspec {

namespace {

constexpr int kProbeTimeoutMs = 10000;
constexpr uint8_t kHelloCommand = 14;  // RPC_CMD_HELLO: fixed in every protocol version
constexpr size_t kCapsSize = 24;       // rpc_msg_hello_req: connection capabilities (none)
constexpr size_t kHelloReplySize = 4 + kCapsSize;  // major, minor, patch, padding, caps

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

}  // namespace

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

bool peer_is(int fd, const sockaddr_in& addr) {
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 || peer.sin_family != AF_INET) return false;
    return peer.sin_port == addr.sin_port && peer.sin_addr.s_addr == addr.sin_addr.s_addr;
}

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

ino_t socket_inode(int fd) {
    struct stat st{};
    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
}

Socket scan_for_connection(const sockaddr_in& addr, const std::set<ino_t>& retired) {
    const long max_fd = std::min<long>(sysconf(_SC_OPEN_MAX), 4096);
    for (int fd = 0; fd < max_fd; ++fd) {
        if (!peer_is(fd, addr)) continue;
        const ino_t inode = socket_inode(fd);
        if (!retired.count(inode)) return {fd, inode};
    }
    return {};
}

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

}  // namespace localspec
