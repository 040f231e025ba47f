// The sockets of RPC workers as localspec sees them, beside ggml's own client: probing an
// endpoint before ggml connects (ggml would abort on failure), and finding ggml's connection to
// a worker among this process's sockets to watch it. Plain C++ (no llama.h, no pybind11); used
// by rpc.cpp only.
#pragma once

#include <netinet/in.h>
#include <sys/types.h>

#include <set>
#include <string>

#include "base/errors.h"

namespace localspec {

// A UserError(RemoteWorker) with this sentence: what every failure to reach a worker raises.
UserError worker_error(const std::string& message);

// ggml's socket of a connection, as found once: the descriptor and the socket's inode. ggml
// closes the socket when the last model on it is freed and the descriptor's number is soon
// another socket's (ggml's next connection, say): only the same inode is the same socket.
struct Socket {
    int fd = -1;
    ino_t inode = 0;
};

// HOST:PORT as an IPv4 address (ggml-rpc connects over IPv4). Throws UserError(RemoteWorker).
sockaddr_in resolve(const std::string& endpoint);

// TCP connect + ggml's HELLO, as ggml's client does, with timeouts: ggml itself would abort.
// Throws UserError(RemoteWorker) saying what is wrong with the worker.
void probe(const std::string& endpoint);

// Whether `fd` is a socket connected to `addr`.
bool peer_is(int fd, const sockaddr_in& addr);

// A silent peer (a machine that vanished) fails ggml's pending read within about half a
// minute instead of never: TCP keepalive on ggml's socket.
void keep_alive(int fd);

// The inode of the socket open as `fd` (0: none).
ino_t socket_inode(int fd);

// ggml's connection to `addr`: a socket of this process whose peer it is, other than the
// `retired` ones (fd -1 when none).
Socket scan_for_connection(const sockaddr_in& addr, const std::set<ino_t>& retired);

// Whether the worker closed the connection (or it broke): readable EOF or an error. Between
// passes ggml's connection carries nothing, so only a hang-up counts (data is never consumed).
bool connection_closed(int fd);

}  // namespace localspec
