#include "transport/fd_exchange.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "transport/device_handles.h"

namespace anyr {
namespace {

void copyText(char* dst, size_t n, const std::string& s) { std::snprintf(dst, n, "%s", s.c_str()); }

std::string textOf(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

// sockaddr_un for `name` (abstract when `abstract`), and its length.
socklen_t unixAddress(const std::string& name, bool abstract, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  if (abstract) {
    std::memcpy(a->sun_path + 1, name.data(), name.size());  // sun_path[0] = '\0'
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  }
  std::memcpy(a->sun_path, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + 1);
}

Socket unixSocket(std::string* err) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) *err = std::string("socket(AF_UNIX): ") + std::strerror(errno);
  return Socket(fd);
}

std::string randomHex(std::random_device& rd, int words) {
  std::string s;
  char buf[9];
  for (int i = 0; i < words; ++i) {
    std::snprintf(buf, sizeof(buf), "%08x", rd());
    s += buf;
  }
  return s;
}

}  // namespace

std::string fdwire::sendFd(const std::string& name, bool abstract, int fd,
                           const fdwire::FdMessage& msg, const Deadline& deadline) {
  std::string err;
  Socket s = unixSocket(&err);
  if (!s.valid()) return err;
  sockaddr_un a;
  const socklen_t len = unixAddress(name, abstract, &a);
  // A listening Unix socket accepts a connection into its backlog at once; EAGAIN means the
  // backlog is full for the moment (retried until the deadline). Refusal or a missing path means
  // the name is not reachable from here (another network namespace, or a directory not shared).
  for (;;) {
    if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), len) == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    return std::string("connect: ") + std::strerror(errno) +
           (abstract ? " (the abstract socket is reachable only within one network namespace; "
                       "ANYR_IPC_SOCKET_DIR names a shared directory instead)"
                     : "");
  }
  iovec iov{const_cast<fdwire::FdMessage*>(&msg), sizeof(msg)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  std::memset(control, 0, sizeof(control));
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  for (;;) {
    const ssize_t n = ::sendmsg(s.fd(), &m, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(msg))) return "";
    if (n >= 0) return "sendmsg: short send";  // a 24-byte message into an empty socket
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && !deadline.expired()) {
      pollfd p{s.fd(), POLLOUT, 0};
      (void)::poll(&p, 1, std::min(deadline.remainingMs(), 100));
      continue;
    }
    return std::string("sendmsg: ") + std::strerror(errno);
  }
}

namespace {

// Receives one FdMessage and its descriptor from an accepted connection, bounded by `deadline`.
// Returns "" and sets *msg, *fd on success; otherwise why (any descriptor received is closed).
std::string receiveFd(int conn, const Deadline& deadline, fdwire::FdMessage* msg, Socket* fd) {
  size_t got = 0;
  char* dst = reinterpret_cast<char*>(msg);
  while (got < sizeof(*msg)) {
    iovec iov{dst + got, sizeof(*msg) - got};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(conn, &m, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && !deadline.expired()) {
        pollfd p{conn, POLLIN, 0};
        (void)::poll(&p, 1, std::min(deadline.remainingMs(), 100));
        continue;
      }
      return errno == EAGAIN || errno == EWOULDBLOCK
                 ? std::string("timed out")
                 : std::string("recvmsg: ") + std::strerror(errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int f = -1;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (!fd->valid()) {
          *fd = Socket(f);
        } else {
          ::close(f);  // one descriptor per message: extras are not ours to keep
        }
      }
    }
    if ((m.msg_flags & MSG_CTRUNC) != 0) return "ancillary data truncated";
    if (n == 0) return "connection closed after " + std::to_string(got) + " bytes";
    got += static_cast<size_t>(n);
  }
  if (!fd->valid()) return "message without a descriptor";
  return "";
}

}  // namespace

std::string fdSocketDir() {
  std::string dir = env::getString("ANYR_IPC_SOCKET_DIR");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  // dir + "/anyreduce-fd-" + 32 hex + "-" + rank (up to 4 digits) + ".sock" + NUL
  const size_t longest = dir.size() + 1 + 13 + 32 + 1 + 4 + 5 + 1;
  if (!dir.empty() && longest > fdwire::kNameBytes) {
    throwError(anyrInvalidArgument,
               "environment variable ANYR_IPC_SOCKET_DIR='" + dir +
                   "': too long for a socket path (at most " +
                   std::to_string(fdwire::kNameBytes - (longest - dir.size())) + " characters)");
  }
  return dir;
}

FdExchange exchangeFds(Bootstrap& bs, int fd, const std::string& whyNoFd, int timeoutMs) {
  const int n = bs.size();
  const int me = bs.rank();
  if (n > kMaxLocalRanks) {
    throwError(anyrInternalError,
               "exchangeFds: more than " + std::to_string(kMaxLocalRanks) + " ranks");
  }
  FdExchange out;
  out.fds.resize(static_cast<size_t>(n));
  out.errors.assign(static_cast<size_t>(n), "");
  const Deadline deadline(timeoutMs);

  // 1. Listen, before anyone learns the name (so that every later connect finds it).
  std::string dir;
  std::string localError;
  try {
    dir = fdSocketDir();
  } catch (const Error& e) {
    localError = e.what();
  }
  const bool abstract = dir.empty();
  std::random_device rd;
  fdwire::Listing mine{};
  for (int i = 0; i < fdwire::kTokenBytes; i += 4) {
    const uint32_t w = rd();
    std::memcpy(mine.token + i, &w, 4);
  }
  const std::string base = "anyreduce-fd-" + randomHex(rd, 4) + "-" + std::to_string(me);
  const std::string name = abstract ? base : dir + "/" + base + ".sock";
  Socket listener;
  if (localError.empty()) listener = unixSocket(&localError);
  if (listener.valid()) {
    sockaddr_un a;
    const socklen_t len = unixAddress(name, abstract, &a);
    if (::bind(listener.fd(), reinterpret_cast<const sockaddr*>(&a), len) != 0) {
      localError = "bind " + std::string(abstract ? "@" : "") + name + ": " + std::strerror(errno);
      listener.close();
    } else if (::listen(listener.fd(), 4 * kMaxLocalRanks) != 0) {
      localError = std::string("listen: ") + std::strerror(errno);
      listener.close();
    }
  }
  mine.listening = !listener.valid() ? 0 : abstract ? 1 : 2;
  mine.hasFd = fd >= 0 ? 1 : 0;
  copyText(mine.name, sizeof(mine.name), name);
  copyText(mine.error, sizeof(mine.error),
           !localError.empty() ? "could not listen: " + localError : whyNoFd);
  // A path socket is removed once the exchange is over, however it ends.
  struct Unlink {
    std::string path;
    ~Unlink() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } unlinkAtEnd{listener.valid() && !abstract ? name : std::string()};

  const std::vector<fdwire::Listing> all = bs.allGatherValue(mine);

  // 2. Send this rank's descriptor to every peer that listens.
  fdwire::SendRow row{};
  for (int r = 0; r < n; ++r) {
    if (r == me || fd < 0) continue;
    const fdwire::Listing& peer = all[static_cast<size_t>(r)];
    if (!peer.listening) continue;
    fdwire::FdMessage msg{fdwire::kMagic, me, {}};
    std::memcpy(msg.token, peer.token, fdwire::kTokenBytes);
    const std::string err = fdwire::sendFd(textOf(peer.name, sizeof(peer.name)),
                                           peer.listening == 1, fd, msg, deadline);
    if (err.empty()) {
      row.sent[r] = 1;
    } else {
      copyText(row.error[r], sizeof(row.error[r]), err);
    }
  }
  const std::vector<fdwire::SendRow> rows = bs.allGatherValue(row);

  // 3. Receive from the ranks that say they sent (a descriptor they could not send is not
  // waited for).
  int expected = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const fdwire::Listing& sender = all[static_cast<size_t>(r)];
    const fdwire::SendRow& sent = rows[static_cast<size_t>(r)];
    if (!mine.listening) {
      out.errors[static_cast<size_t>(r)] = "this rank " + textOf(mine.error, sizeof(mine.error));
    } else if (!sender.hasFd) {
      out.errors[static_cast<size_t>(r)] = "rank " + std::to_string(r) + " has no descriptor: " +
                                           textOf(sender.error, sizeof(sender.error));
    } else if (!sent.sent[me]) {
      out.errors[static_cast<size_t>(r)] =
          "rank " + std::to_string(r) +
          " could not send its descriptor here: " + textOf(sent.error[me], sizeof(sent.error[me]));
    } else {
      out.errors[static_cast<size_t>(r)] = "pending";
      ++expected;
    }
  }
  while (expected > 0 && !deadline.expired()) {
    pollfd p{listener.fd(), POLLIN, 0};
    const int ready = ::poll(&p, 1, deadline.remainingMs());
    if (ready < 0 && errno != EINTR) {
      ANYR_LOG(Warn, me, "descriptor exchange: poll: " << std::strerror(errno));
      break;
    }
    if (ready <= 0) continue;
    const int c = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue;  // EAGAIN, or a connection reset before accept
    Socket conn(c);
    fdwire::FdMessage msg{};
    Socket got;
    std::string why = receiveFd(conn.fd(), deadline, &msg, &got);
    if (why.empty()) {
      if (msg.magic != fdwire::kMagic || msg.sender < 0 || msg.sender >= n || msg.sender == me) {
        why = "not a descriptor message of this communicator";
      } else if (std::memcmp(msg.token, mine.token, fdwire::kTokenBytes) != 0) {
        why = "wrong secret (claims rank " + std::to_string(msg.sender) + ")";
      } else if (out.errors[static_cast<size_t>(msg.sender)] != "pending") {
        why = "unexpected second descriptor from rank " + std::to_string(msg.sender);
      }
    }
    if (!why.empty()) {
      // Not from a peer of this exchange: dropped (its descriptor closed with `got`).
      ANYR_LOG(Warn, me, "descriptor exchange: ignored a connection: " << why);
      continue;
    }
    out.fds[static_cast<size_t>(msg.sender)] = std::move(got);
    out.errors[static_cast<size_t>(msg.sender)].clear();
    --expected;
  }
  for (int r = 0; r < n; ++r) {
    if (out.errors[static_cast<size_t>(r)] == "pending") {
      out.errors[static_cast<size_t>(r)] = "timed out after " + std::to_string(timeoutMs) +
                                           " ms waiting for rank " + std::to_string(r) +
                                           "'s descriptor";
    }
  }
  return out;
}

}  // namespace anyr
