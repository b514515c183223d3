#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/names.h"

namespace anyr {

// ---------------------------------------------------------------------------------------------
// Deadline

Deadline::Deadline(int timeoutMs)
    : start_(std::chrono::steady_clock::now()),
      end_(start_ + std::chrono::milliseconds(std::max(timeoutMs, 0))),
      timeoutMs_(timeoutMs) {}

int Deadline::remainingMs() const {
  auto now = std::chrono::steady_clock::now();
  if (now >= end_) return 0;
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(end_ - now).count();
  int64_t ms = (us + 999) / 1000;
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

bool Deadline::expired() const { return std::chrono::steady_clock::now() >= end_; }

int64_t Deadline::elapsedMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start_)
      .count();
}

// ---------------------------------------------------------------------------------------------
// SocketAddress

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
  if (family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  } else if (family() == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
  }
}

std::string SocketAddress::toString() const {
  char host[NI_MAXHOST] = {0};
  if (len == 0 || getnameinfo(reinterpret_cast<const sockaddr*>(&storage), len, host, sizeof(host),
                              nullptr, 0, NI_NUMERICHOST) != 0) {
    return "<no address>";
  }
  if (family() == AF_INET6) return "[" + std::string(host) + "]:" + std::to_string(port());
  return std::string(host) + ":" + std::to_string(port());
}

bool SocketAddress::fromLiteral(const std::string& text, uint16_t port, SocketAddress* out) {
  std::string host = text;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr) {
    return false;
  }
  bool ok = false;
  if ((res->ai_family == AF_INET || res->ai_family == AF_INET6) &&
      res->ai_addrlen <= sizeof(out->storage)) {
    *out = SocketAddress{};
    std::memcpy(&out->storage, res->ai_addr, res->ai_addrlen);
    out->len = static_cast<socklen_t>(res->ai_addrlen);
    ok = true;
  }
  freeaddrinfo(res);
  return ok;
}

SocketAddress SocketAddress::loopbackV4(uint16_t port) {
  SocketAddress a;
  auto* sin = reinterpret_cast<sockaddr_in*>(&a.storage);
  sin->sin_family = AF_INET;
  sin->sin_port = htons(port);
  sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.len = sizeof(sockaddr_in);
  return a;
}

// ---------------------------------------------------------------------------------------------
// Socket

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);  // the descriptor is released even when close reports an error
    fd_ = -1;
  }
}

// ---------------------------------------------------------------------------------------------
// Choosing, binding, connecting

static SocketAddress interfaceAddress(const std::string& ifname, uint16_t port) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throwErrno("bootstrap: getifaddrs for ANYR_SOCKET_IFNAME");
  SocketAddress found;
  std::string withIpv4;  // interfaces that have an IPv4 address, for the error message
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if (found.len == 0 && ifname == ifa->ifa_name) {
      std::memcpy(&found.storage, ifa->ifa_addr, sizeof(sockaddr_in));
      found.len = sizeof(sockaddr_in);
    }
    if (withIpv4.find(std::string(ifa->ifa_name) + ",") == std::string::npos) {
      withIpv4 += std::string(ifa->ifa_name) + ",";
    }
  }
  freeifaddrs(list);
  if (found.len == 0) {
    if (!withIpv4.empty()) withIpv4.pop_back();
    throwError(anyrInvalidArgument, "environment variable ANYR_SOCKET_IFNAME='" + ifname +
                                        "': no interface of that name has an IPv4 address "
                                        "(interfaces with one: " +
                                        (withIpv4.empty() ? "none" : withIpv4) + ")");
  }
  found.setPort(port);
  return found;
}

static bool isWildcard(const SocketAddress& a) {
  if (a.family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
  return IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr);
}

SocketAddress chooseListenAddress() {
  int64_t port = env::getInt("ANYR_SOCKET_PORT");
  if (port < 0 || port > 65535) {
    throwError(anyrInvalidArgument, "environment variable ANYR_SOCKET_PORT='" +
                                        env::getString("ANYR_SOCKET_PORT") +
                                        "': must be a port number in [0, 65535]");
  }
  uint16_t p = static_cast<uint16_t>(port);
  if (env::isSet("ANYR_SOCKET_ADDR")) {
    std::string text = env::getString("ANYR_SOCKET_ADDR");
    SocketAddress addr;
    if (!SocketAddress::fromLiteral(text, p, &addr)) {
      throwError(anyrInvalidArgument, "environment variable ANYR_SOCKET_ADDR='" + text +
                                          "': must be an IPv4 or IPv6 address literal");
    }
    if (isWildcard(addr)) {
      throwError(anyrInvalidArgument, "environment variable ANYR_SOCKET_ADDR='" + text +
                                          "': must be an address the other ranks can connect "
                                          "to, not a wildcard");
    }
    return addr;
  }
  if (env::isSet("ANYR_SOCKET_IFNAME")) {
    return interfaceAddress(env::getString("ANYR_SOCKET_IFNAME"), p);
  }
  return SocketAddress::loopbackV4(p);
}

static Socket newSocket(int family, const char* what) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throwErrno(std::string("bootstrap: socket() for ") + what);
  return Socket(fd);
}

static void setNoDelay(int fd) {
  int one = 1;
  // Only a latency hint for small control messages; failure is harmless.
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Socket listenOn(const SocketAddress& addr) {
  Socket s = newSocket(addr.family(), "the bootstrap listener");
  int one = 1;
  if (setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    throwErrno("bootstrap: setsockopt(SO_REUSEADDR) on " + addr.toString());
  }
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
    throwErrno("bootstrap: cannot bind " + addr.toString());
  }
  if (::listen(s.fd(), SOMAXCONN) != 0)
    throwErrno("bootstrap: cannot listen on " + addr.toString());
  return s;
}

SocketAddress localAddress(const Socket& sock) {
  SocketAddress a;
  a.len = sizeof(a.storage);
  if (getsockname(sock.fd(), reinterpret_cast<sockaddr*>(&a.storage), &a.len) != 0) {
    throwErrno("bootstrap: getsockname");
  }
  return a;
}

static bool sameEndpoint(const SocketAddress& a, const SocketAddress& b) {
  return a.len == b.len && a.port() == b.port() && a.toString() == b.toString();
}

// One attempt. Returns 0 on success, else errno.
static int connectOnce(const Socket& s, const SocketAddress& addr, const Deadline& deadline) {
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) == 0) {
    return 0;
  }
  if (errno != EINPROGRESS && errno != EINTR) return errno;
  for (;;) {
    pollfd p{s.fd(), POLLOUT, 0};
    int n = ::poll(&p, 1, deadline.remainingMs());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    return err;
  }
}

Socket connectWithRetry(const SocketAddress& addr, const Deadline& deadline,
                        std::string* lastError) {
  int pauseMs = 10;
  for (;;) {
    Socket s = newSocket(addr.family(), "a bootstrap connection");
    int err = connectOnce(s, addr, deadline);
    if (err == 0) {
      // A connect to a local port nobody listens on can, rarely, connect the socket to
      // itself (TCP simultaneous open). That is not rank 0: drop it and retry.
      if (!sameEndpoint(localAddress(s), addr)) {
        setNoDelay(s.fd());
        return s;
      }
      err = ECONNREFUSED;
    }
    if (lastError != nullptr) *lastError = std::strerror(err);
    s.close();
    int left = deadline.remainingMs();
    if (left <= 0) return Socket();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(pauseMs, left)));
    pauseMs = std::min(pauseMs * 2, 200);
  }
}

Socket acceptNow(const Socket& listener, SocketAddress* from) {
  for (;;) {
    SocketAddress a;
    a.len = sizeof(a.storage);
    int fd = ::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&a.storage), &a.len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      setNoDelay(fd);
      if (from != nullptr) {
        if (a.len > sizeof(a.storage)) a.len = 0;  // truncated: unknown
        *from = a;
      }
      return Socket(fd);
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
      ANYR_LOG(Warn, 0, "bootstrap: accept failed: " << std::strerror(errno));
    }
    return Socket();
  }
}

// ---------------------------------------------------------------------------------------------
// Bounded I/O

static bool isClosedErrno(int e) { return e == EPIPE || e == ECONNRESET || e == ENOTCONN; }

// Waits until `fd` is ready for `events`. Returns kDone, kTimeout or kError.
static IoResult waitFor(int fd, short events, const Deadline& deadline, int* err) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, deadline.remainingMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return IoResult::kError;
    }
    if (n == 0) return IoResult::kTimeout;
    // POLLERR/POLLHUP: let the following send/recv report what happened.
    return IoResult::kDone;
  }
}

IoResult sendAll(int fd, const void* buf, size_t len, const Deadline& deadline, int* err) {
  const char* p = static_cast<const char*>(buf);
  size_t done = 0;
  *err = 0;
  while (done < len) {
    ssize_t n = ::send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (deadline.expired()) return IoResult::kTimeout;
      IoResult r = waitFor(fd, POLLOUT, deadline, err);
      if (r != IoResult::kDone) return r;
      continue;
    }
    *err = n < 0 ? errno : EPIPE;
    return isClosedErrno(*err) ? IoResult::kClosed : IoResult::kError;
  }
  return IoResult::kDone;
}

IoResult recvSome(int fd, void* buf, size_t len, size_t* got, int* err) {
  *got = 0;
  *err = 0;
  for (;;) {
    ssize_t n = ::recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) {
      *got = static_cast<size_t>(n);
      return IoResult::kDone;
    }
    if (n == 0) return len == 0 ? IoResult::kDone : IoResult::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return IoResult::kTimeout;
    *err = errno;
    return isClosedErrno(errno) ? IoResult::kClosed : IoResult::kError;
  }
}

IoResult recvAll(int fd, void* buf, size_t len, const Deadline& deadline, int* err) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  *err = 0;
  while (done < len) {
    size_t got = 0;
    IoResult r = recvSome(fd, p + done, len - done, &got, err);
    if (r == IoResult::kDone) {
      done += got;
      continue;
    }
    if (r != IoResult::kTimeout) return r;
    if (deadline.expired()) return IoResult::kTimeout;
    r = waitFor(fd, POLLIN, deadline, err);
    if (r != IoResult::kDone) return r;
  }
  return IoResult::kDone;
}

void closeGracefully(Socket* sock) {
  if (sock == nullptr || !sock->valid()) return;
  (void)::shutdown(sock->fd(), SHUT_WR);
  // Discard what is already queued (bounded: we only read what is there now).
  char sink[4096];
  for (int i = 0; i < 1024; ++i) {
    ssize_t n = ::recv(sock->fd(), sink, sizeof(sink), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  sock->close();
}

std::string ioResultText(IoResult r, int err) {
  if (r == IoResult::kError) return std::strerror(err);
  static constexpr Named<IoResult> kNames[] = {{IoResult::kDone, "no error"},
                                               {IoResult::kTimeout, "timed out"},
                                               {IoResult::kClosed, "closed the connection"}};
  return nameOf(kNames, r, "unknown error");
}

}  // namespace anyr
