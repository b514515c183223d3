// Small TCP helpers for the bootstrap: an RAII socket, addresses, deadlines, and bounded
// send/receive. Every socket is created close-on-exec and non-blocking; every wait goes
// through poll() with the time left until a Deadline; sends use MSG_NOSIGNAL so a peer that
// went away gives EPIPE instead of killing the process with SIGPIPE.
//
// Errors the caller can attribute to a peer (timeout, closed connection) come back as an
// IoResult so that the caller can name the rank; setup failures (socket, bind, listen) throw
// anyr::Error with the address in the message.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace anyr {

// A point in time `timeoutMs` after construction. Copyable; never throws.
class Deadline {
 public:
  explicit Deadline(int timeoutMs);
  int timeoutMs() const { return timeoutMs_; }
  // Milliseconds left, rounded up, 0 once expired; capped at INT_MAX for poll().
  int remainingMs() const;
  bool expired() const;
  int64_t elapsedMs() const;

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point end_;
  int timeoutMs_;
};

// An IPv4 or IPv6 socket address.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  uint16_t port() const;  // host byte order
  void setPort(uint16_t port);
  // "127.0.0.1:41234" or "[::1]:41234" (with "%scope" for link-local IPv6).
  std::string toString() const;

  // Parses an IPv4 or IPv6 literal ("10.0.0.1", "::1", "[fe80::1%eth0]"). Returns false
  // when `text` is not one.
  static bool fromLiteral(const std::string& text, uint16_t port, SocketAddress* out);
  static SocketAddress loopbackV4(uint16_t port);
};

// Owns one file descriptor; closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

 private:
  int fd_ = -1;
};

// The address rank 0 listens on: ANYR_SOCKET_ADDR if set (IPv4 or IPv6 literal), else the
// first IPv4 address of interface ANYR_SOCKET_IFNAME if set, else 127.0.0.1; the port is
// ANYR_SOCKET_PORT (0: any free port). Throws anyrInvalidArgument naming the variable.
SocketAddress chooseListenAddress();

// Binds (SO_REUSEADDR) and listens. Throws anyrSystemError naming the address.
Socket listenOn(const SocketAddress& addr);

// The address a socket is bound to (getsockname). Throws anyrSystemError.
SocketAddress localAddress(const Socket& sock);

// Connects, retrying refused/unreachable attempts with a growing pause until the deadline.
// Returns an invalid Socket on expiry and the last error's text in *lastError.
Socket connectWithRetry(const SocketAddress& addr, const Deadline& deadline,
                        std::string* lastError);

// Accepts one pending connection without waiting. Returns an invalid Socket when none is
// pending (or on a transient error such as a connection reset before accept). The remote
// address goes to *from when non-null (len 0 if unknown).
Socket acceptNow(const Socket& listener, SocketAddress* from = nullptr);

enum class IoResult {
  kDone,     // all bytes moved
  kTimeout,  // the deadline expired first
  kClosed,   // the peer closed or reset the connection
  kError,    // another error; *err holds errno
};

// Moves exactly `len` bytes, waiting (poll) at most until the deadline.
IoResult sendAll(int fd, const void* buf, size_t len, const Deadline& deadline, int* err);
IoResult recvAll(int fd, void* buf, size_t len, const Deadline& deadline, int* err);

// One non-blocking receive step: returns kDone with *got > 0 bytes read, kTimeout when
// nothing is available now (*got = 0), kClosed on end of stream or reset, kError otherwise.
IoResult recvSome(int fd, void* buf, size_t len, size_t* got, int* err);

// Best-effort orderly close: shut down the sending side (FIN after the queued data), discard
// what the peer already sent (so that the close does not turn into a reset that could destroy
// the data we queued for it), then close. Never throws.
void closeGracefully(Socket* sock);

// "peer closed the connection", "timed out", or strerror(err), for messages.
std::string ioResultText(IoResult r, int err);

}  // namespace anyr
