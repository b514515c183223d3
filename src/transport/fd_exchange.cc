#include "transport/fd_exchange.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "device/handles.h"

namespace anyr {
namespace {

using Clock = std::chrono::steady_clock;

void copyText(char* dst, size_t n, const std::string& s) { std::snprintf(dst, n, "%s", s.c_str()); }

std::string textOf(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

std::string hexOf(const uint8_t* p, size_t n) {
  std::string s;
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", p[i]);
    s += buf;
  }
  return s;
}

// sockaddr_un for `name` (abstract when `abstract`), and its length. `name` fits: callers keep
// names within fdwire::kNameBytes.
socklen_t unixAddress(const std::string& name, bool abstract, sockaddr_un* a) {
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  const size_t len = std::min(name.size(), sizeof(a->sun_path) - 1);
  if (abstract) {
    std::memcpy(a->sun_path + 1, name.data(), len);  // sun_path[0] = '\0'
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len);
  }
  std::memcpy(a->sun_path, name.data(), len);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len + 1);
}

Socket unixSocket(std::string* err) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) *err = std::string("socket(AF_UNIX): ") + std::strerror(errno);
  return Socket(fd);
}

// True when nobody listens on the path socket `path` (a connection is refused). A connection
// that is accepted, or a full backlog, means a live listener; it is closed at once.
bool refusesConnection(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) return false;  // not a name bind could take
  std::string err;
  Socket s = unixSocket(&err);
  if (!s.valid()) return false;
  sockaddr_un a;
  const socklen_t len = unixAddress(path, false, &a);
  for (;;) {
    if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), len) == 0) return false;
    if (errno == EINTR) continue;
    return errno == ECONNREFUSED;
  }
}

bool parseSocketFileName(const char* name, uint64_t* pidNs, int* pid) {
  unsigned long long ns = 0;
  int p = 0;
  int rank = 0;
  unsigned nonce = 0;
  int end = 0;
  if (std::sscanf(name, "fd-%llx-%d-%d-%8x.sock%n", &ns, &p, &rank, &nonce, &end) != 4 ||
      end == 0 || name[end] != '\0' || p <= 0 || rank < 0) {
    return false;
  }
  // Only the canonical spelling: anything else is not this module's file.
  if (fdwire::socketFileName(ns, p, rank, nonce) != name) return false;
  *pidNs = ns;
  *pid = p;
  return true;
}

}  // namespace

namespace {

// One attempt of fdwire::sendFd. Sets *retry when the receiver closed the connection before the
// message went out (it drops a connection that stayed silent past its deadline: this sender
// may have been descheduled between connect and send).
std::string sendOnce(const std::string& name, bool abstract, int fd, const fdwire::FdMessage& msg,
                     const Deadline& deadline, bool* retry) {
  *retry = false;
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
    // Short: the reason travels in a 120-character field (fdwire::SendRow).
    const int e = errno;
    const char* hint = "";
    if (abstract) {
      hint = " (an abstract name reaches one network namespace; ANYR_IPC_SOCKET=path)";
    } else if (e == ENOENT) {
      hint = " (the ranks must share the directory: ANYR_IPC_SOCKET_DIR)";
    } else if (e == EACCES || e == EPERM) {
      hint = " (an owner-only directory: run the ranks as one user)";
    }
    return std::string("connect: ") + std::strerror(e) + hint;
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
    *retry = errno == EPIPE || errno == ECONNRESET;
    return std::string("sendmsg: ") + std::strerror(errno);
  }
}

}  // namespace

std::string fdwire::sendFd(const std::string& name, bool abstract, int fd,
                           const fdwire::FdMessage& msg, const Deadline& deadline) {
  // A few attempts, not until the deadline: a receiver that refuses this process (another
  // user) closes every connection at once.
  constexpr int kAttempts = 3;
  std::string err;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    bool retry = false;
    err = sendOnce(name, abstract, fd, msg, deadline, &retry);
    if (err.empty() || !retry || deadline.expired()) break;
  }
  return err;
}

std::string fdwire::checkMessage(const FdMessage& msg, int n, int me, const uint8_t* token) {
  if (msg.magic != kMagic || msg.sender < 0 || msg.sender >= n || msg.sender == me) {
    return "not a descriptor message of this communicator";
  }
  // Constant time: how long the comparison takes says nothing about how much of a guess matched.
  if (CRYPTO_memcmp(msg.token, token, kTokenBytes) != 0) {
    return "wrong secret (claims rank " + std::to_string(msg.sender) + ")";
  }
  return "";
}

std::string fdwire::checkPeerUid(const ucred& peer, uid_t myUid) {
  if (peer.uid == myUid) return "";
  return "peer credentials uid " + std::to_string(peer.uid) + " (pid " + std::to_string(peer.pid) +
         ") are not this process's uid " + std::to_string(myUid) +
         ": only the same user may pass descriptors";
}

std::string fdwire::checkSenderProcess(const ucred& peer, const Listing& sender, uint64_t myPidNs) {
  if (myPidNs == 0 || sender.pidNs != myPidNs || sender.pid <= 0) return "";
  if (peer.pid == sender.pid) return "";
  return "connecting pid " + std::to_string(peer.pid) + " is not the rank's published pid " +
         std::to_string(sender.pid) + " (same PID namespace)";
}

uint64_t fdwire::namespaceId(const char* kind) {
  struct stat st;
  if (::stat((std::string("/proc/self/ns/") + kind).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

std::string fdwire::prepareSocketDir(const std::string& dir, uid_t uid) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return "mkdir " + dir + ": " + std::strerror(errno);
  }
  // O_NOFOLLOW: a symbolic link planted at this name is refused, not followed.
  Socket d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!d.valid()) {
    const int e = errno;
    return "open " + dir + ": " + std::strerror(e) +
           (e == ELOOP || e == ENOTDIR ? " (not a directory, or a symbolic link: refused)" : "");
  }
  struct stat st;
  if (::fstat(d.fd(), &st) != 0) return "fstat " + dir + ": " + std::strerror(errno);
  if (st.st_uid != uid) {
    return dir + " belongs to uid " + std::to_string(st.st_uid) + ", not this process's uid " +
           std::to_string(uid) +
           ": refused for sockets (ANYR_IPC_SOCKET_DIR names another base directory)";
  }
  if ((st.st_mode & 07777) != 0700 && ::fchmod(d.fd(), 0700) != 0) {
    return "chmod 0700 " + dir + ": " + std::strerror(errno);
  }
  return "";
}

std::string fdwire::socketFileName(uint64_t pidNs, int pid, int rank, uint32_t nonce) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "fd-%llx-%d-%d-%08x.sock", static_cast<unsigned long long>(pidNs),
                pid, rank, nonce);
  return buf;
}

std::vector<std::string> fdwire::removeStaleSockets(const std::string& dir, uid_t uid,
                                                    uint64_t myPidNs) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return removed;
  const int dfd = ::dirfd(d);
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    uint64_t ns = 0;
    int pid = 0;
    if (!parseSocketFileName(e->d_name, &ns, &pid)) continue;
    struct stat st;
    if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISSOCK(st.st_mode) || st.st_uid != uid) continue;
    // Between bind and listen a live process's socket refuses connections too: a refusal counts
    // only where that cannot be the case, its process gone (a pid of this PID namespace that no
    // longer exists) or the file too old to be in that moment.
    const bool processGone = myPidNs != 0 && ns == myPidNs && ::kill(pid, 0) != 0 && errno == ESRCH;
    const bool old = now - st.st_mtime >= kStaleProbeAgeSeconds;
    if (!processGone && !old) continue;
    if (!refusesConnection(dir + "/" + e->d_name)) continue;
    if (::unlinkat(dfd, e->d_name, 0) == 0) removed.push_back(e->d_name);
  }
  ::closedir(d);
  return removed;
}

namespace {

// Serves a listening socket from a thread: accepts every connection at once, checks its peer
// credentials, gives each its own deadline, and keeps the first valid descriptor per sender.
// Never throws out of the thread; what stops the serving is in failure().
class Receiver {
 public:
  Receiver(int listener, int me, const std::vector<fdwire::Listing>& all, const uint8_t* token,
           uid_t uid, uint64_t pidNs)
      : listener_(listener),
        me_(me),
        n_(static_cast<int>(all.size())),
        all_(all),
        uid_(uid),
        pidNs_(pidNs),
        got_(all.size()) {
    std::memcpy(token_, token, fdwire::kTokenBytes);
  }
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;
  ~Receiver() { stop(); }

  // "" once serving, else why not.
  std::string start() {
    wake_ = Socket(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_.valid()) return std::string("eventfd: ") + std::strerror(errno);
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
      return std::string("starting its thread: ") + e.what();
    }
    return "";
  }

  // Returns once every rank r with expected[r] has delivered, serving failed, or the deadline.
  void waitFor(const std::vector<char>& expected, const Deadline& deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      bool all = true;
      for (size_t r = 0; r < expected.size(); ++r) all = all && (!expected[r] || got_[r].valid());
      if (all || !failure_.empty() || deadline.expired()) return;
      cv_.wait_for(lock, std::chrono::milliseconds(std::min(deadline.remainingMs(), 100)));
    }
  }

  Socket take(int r) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(got_[static_cast<size_t>(r)]);
  }

  std::string failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    const uint64_t one = 1;
    (void)!::write(wake_.fd(), &one, sizeof(one));
    thread_.join();
  }

 private:
  struct Conn {
    Socket s;
    ucred cred{};
    Clock::time_point deadline;
    fdwire::FdMessage msg{};
    size_t got = 0;
    Socket fd;  // the descriptor that came with the message
    bool done = false;
  };

  static constexpr int kLogged = 8;  // dropped connections logged one by one; then a count

  void run() {
    std::deque<Conn> conns;
    std::vector<pollfd> pfds;
    Clock::time_point listenerPausedUntil{};
    try {
      for (;;) {
        const Clock::time_point now = Clock::now();
        const bool paused = now < listenerPausedUntil;
        pfds.clear();
        pfds.push_back(pollfd{wake_.fd(), POLLIN, 0});
        pfds.push_back(pollfd{paused ? -1 : listener_, POLLIN, 0});
        Clock::time_point next = Clock::time_point::max();
        if (paused) next = listenerPausedUntil;
        for (const Conn& c : conns) {
          pfds.push_back(pollfd{c.s.fd(), POLLIN, 0});
          next = std::min(next, c.deadline);
        }
        int timeout = -1;
        if (next != Clock::time_point::max()) {
          const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
          timeout = static_cast<int>(std::max<int64_t>(0, ms + 1));
        }
        if (::poll(pfds.data(), pfds.size(), timeout) < 0) {
          if (errno == EINTR) continue;
          fail(std::string("poll: ") + std::strerror(errno));
          break;
        }
        if (pfds[0].revents != 0) {
          uint64_t v = 0;
          (void)!::read(wake_.fd(), &v, sizeof(v));
          std::lock_guard<std::mutex> lock(mu_);
          if (stopping_) break;
        }
        // The open connections first (their pollfds follow `conns` in order), then their
        // deadlines, then new connections.
        for (size_t i = 0; i < conns.size(); ++i) {
          if (pfds[i + 2].revents != 0) conns[i].done = serve(conns[i]);
        }
        const Clock::time_point t = Clock::now();
        for (Conn& c : conns) {
          if (c.done || t < c.deadline) continue;
          c.done = serve(c);  // what arrived just now still counts
          if (!c.done) {
            drop(c, "silent for " + std::to_string(fdwire::kConnectionDeadlineMs) + " ms (" +
                        std::to_string(c.got) + " of " + std::to_string(sizeof(c.msg)) + " bytes)");
            c.done = true;
          }
        }
        conns.erase(
            std::remove_if(conns.begin(), conns.end(), [](const Conn& c) { return c.done; }),
            conns.end());
        if (pfds[1].revents != 0) acceptAll(&conns, &listenerPausedUntil);
      }
      if (dropped_ > kLogged) {
        ANYR_LOG(Warn, me_,
                 "descriptor exchange: " << dropped_ << " connections dropped in all (the first "
                                         << kLogged << " logged)");
      }
    } catch (const std::exception& e) {
      fail(std::string("serving: ") + e.what());
    }
  }

  void acceptAll(std::deque<Conn>* conns, Clock::time_point* pausedUntil) {
    for (int i = 0; i < 256; ++i) {  // bounded, so that open connections are served in between
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: give back the oldest connection, and do not spin on a listener
          // that stays readable.
          if (!conns->empty()) {
            evictOldest(conns,
                        "dropped to free a descriptor (" + std::string(std::strerror(errno)) + ")");
          } else {
            *pausedUntil = Clock::now() + std::chrono::milliseconds(10);
          }
        }
        return;  // EAGAIN: none left
      }
      Conn c;
      c.s = Socket(fd);
      socklen_t len = sizeof(c.cred);
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len) != 0) {
        drop(c, std::string("SO_PEERCRED: ") + std::strerror(errno));
        continue;
      }
      const std::string why = fdwire::checkPeerUid(c.cred, uid_);
      if (!why.empty()) {
        drop(c, "refused: " + why);  // closed unread
        continue;
      }
      c.deadline = Clock::now() + std::chrono::milliseconds(fdwire::kConnectionDeadlineMs);
      if (serve(c)) continue;  // a sender writes right after connecting: often already here
      if (conns->size() >= fdwire::kMaxConnections) {
        evictOldest(conns, "more than " + std::to_string(fdwire::kMaxConnections) +
                               " connections open at once: the oldest dropped");
      }
      conns->push_back(std::move(c));
    }
  }

  void evictOldest(std::deque<Conn>* conns, const std::string& why) {
    Conn& oldest = conns->front();
    if (!serve(oldest)) drop(oldest, why);  // unless its message has just arrived
    conns->pop_front();
  }

  // Reads what `c` has sent. Returns true when `c` is finished: its descriptor delivered or the
  // connection dropped; false while its message is incomplete.
  bool serve(Conn& c) {
    char* dst = reinterpret_cast<char*>(&c.msg);
    while (c.got < sizeof(c.msg)) {
      iovec iov{dst + c.got, sizeof(c.msg) - c.got};
      alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof(control);
      const ssize_t n = ::recvmsg(c.s.fd(), &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        drop(c, std::string("recvmsg: ") + std::strerror(errno));
        return true;
      }
      for (cmsghdr* h = CMSG_FIRSTHDR(&m); h != nullptr; h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int f = -1;
          std::memcpy(&f, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
          if (!c.fd.valid()) {
            c.fd = Socket(f);
          } else {
            ::close(f);  // one descriptor per message: extras are not ours to keep
          }
        }
      }
      if ((m.msg_flags & MSG_CTRUNC) != 0) {
        drop(c, "ancillary data truncated");
        return true;
      }
      if (n == 0) {
        drop(c, "closed after " + std::to_string(c.got) + " bytes");
        return true;
      }
      c.got += static_cast<size_t>(n);
    }
    if (!c.fd.valid()) {
      drop(c, "message without a descriptor");
      return true;
    }
    std::string why = fdwire::checkMessage(c.msg, n_, me_, token_);
    if (why.empty()) {
      why = fdwire::checkSenderProcess(c.cred, all_[static_cast<size_t>(c.msg.sender)], pidNs_);
      if (!why.empty()) why = "claims rank " + std::to_string(c.msg.sender) + ": " + why;
    }
    if (why.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      Socket& slot = got_[static_cast<size_t>(c.msg.sender)];
      if (slot.valid()) {
        why = "unexpected second descriptor from rank " + std::to_string(c.msg.sender);
      } else {
        slot = std::move(c.fd);
        cv_.notify_all();
      }
    }
    if (!why.empty()) drop(c, why);
    return true;
  }

  // Not from a peer of this exchange: its descriptor, if any, is closed with `c`.
  void drop(const Conn& c, const std::string& why) {
    ++dropped_;
    if (dropped_ <= kLogged) {
      ANYR_LOG(Warn, me_,
               "descriptor exchange: dropped a connection (pid " << c.cred.pid << ", uid "
                                                                 << c.cred.uid << "): " << why);
    }
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = why;
    cv_.notify_all();
  }

  const int listener_;
  const int me_;
  const int n_;
  const std::vector<fdwire::Listing>& all_;
  const uid_t uid_;
  const uint64_t pidNs_;
  uint8_t token_[fdwire::kTokenBytes];
  Socket wake_;
  std::thread thread_;
  int dropped_ = 0;  // the thread's own

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Socket> got_;  // [rank]: the first valid descriptor it delivered
  bool stopping_ = false;
  std::string failure_;
};

}  // namespace

std::string fdSocketDir() {
  const std::string kind = env::getString("ANYR_IPC_SOCKET");
  if (kind == "abstract") return "";
  if (kind != "path") {
    throwError(anyrInvalidArgument,
               "environment variable ANYR_IPC_SOCKET='" + kind + "': must be path or abstract");
  }
  std::string base = env::getString("ANYR_IPC_SOCKET_DIR");
  if (base.empty()) base = "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string dir =
      (base == "/" ? std::string() : base) + "/anyreduce-" + std::to_string(::geteuid());
  // The longest name socketFileName gives on this host: the PID namespace as it is (at least 8
  // hex digits), the largest pid Linux hands out (4194304) and rank.
  const std::string file = fdwire::socketFileName(
      std::max<uint64_t>(fdwire::namespaceId("pid"), 0xffffffffu), 4194304, kMaxLocalRanks - 1, 0);
  const size_t longest = dir.size() + 1 + file.size() + 1;  // with the terminator
  if (longest > fdwire::kNameBytes) {
    throwError(anyrInvalidArgument,
               "environment variable ANYR_IPC_SOCKET_DIR='" + base +
                   "': too long for a socket path (at most " +
                   std::to_string(fdwire::kNameBytes - (longest - base.size())) + " characters)");
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
  const uid_t uid = ::geteuid();
  const uint64_t pidNs = fdwire::namespaceId("pid");
  fdwire::Listing mine{};
  mine.pid = static_cast<int32_t>(::getpid());
  mine.uid = static_cast<uint32_t>(uid);
  mine.pidNs = pidNs;
  mine.userNs = fdwire::namespaceId("user");
  mine.hasFd = fd >= 0 ? 1 : 0;

  // 1. Listen, before anyone learns the name (so that every later connect finds it).
  std::string localError;
  std::string dir;
  uint8_t nonce[16] = {0};
  try {
    dir = fdSocketDir();
    randomBytes(mine.token, sizeof(mine.token));
    randomBytes(nonce, sizeof(nonce));
  } catch (const Error& e) {
    localError = e.what();
  }
  const bool abstract = localError.empty() && dir.empty();
  std::string name;
  if (localError.empty() && abstract) {
    name = "anyreduce-fd-" + hexOf(nonce, sizeof(nonce)) + "-" + std::to_string(me);
  } else if (localError.empty()) {
    localError = fdwire::prepareSocketDir(dir, uid);
    if (localError.empty()) {
      const std::vector<std::string> stale = fdwire::removeStaleSockets(dir, uid, pidNs);
      if (!stale.empty()) {
        ANYR_LOG(Info, me,
                 "descriptor exchange: removed " << stale.size() << " stale socket(s) from " << dir
                                                 << " (nobody listened on them)");
      }
      uint32_t word = 0;
      std::memcpy(&word, nonce, sizeof(word));
      name = dir + "/" + fdwire::socketFileName(pidNs, mine.pid, me, word);
    }
  }
  Socket listener;
  // A path socket is removed once the exchange is over, however it ends.
  struct Unlink {
    std::string path;
    ~Unlink() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } unlinkAtEnd;
  if (localError.empty()) listener = unixSocket(&localError);
  if (listener.valid()) {
    sockaddr_un a;
    const socklen_t len = unixAddress(name, abstract, &a);
    if (::bind(listener.fd(), reinterpret_cast<const sockaddr*>(&a), len) != 0) {
      localError = "bind " + std::string(abstract ? "@" : "") + name + ": " + std::strerror(errno);
      listener.close();
    } else {
      if (!abstract) unlinkAtEnd.path = name;
      // Owner only (the directory already is): with the checks on every connection, defence in
      // depth should the directory's mode ever be widened.
      if (!abstract && ::chmod(name.c_str(), 0600) != 0) {
        localError = "chmod 0600 " + name + ": " + std::strerror(errno);
        listener.close();
      } else if (::listen(listener.fd(), 4 * kMaxLocalRanks) != 0) {
        localError = std::string("listen: ") + std::strerror(errno);
        listener.close();
      }
    }
  }
  mine.listening = !listener.valid() ? 0 : abstract ? 1 : 2;
  copyText(mine.name, sizeof(mine.name), name);
  copyText(mine.error, sizeof(mine.error),
           !localError.empty() ? "could not listen: " + localError : whyNoFd);

  const std::vector<fdwire::Listing> all = bs.allGatherValue(mine);

  // From here to the end this rank's socket is served, every connection at once, so that no
  // sender waits on a backlog that strangers filled.
  Receiver receiver(listener.fd(), me, all, mine.token, uid, pidNs);
  std::string serveError;
  if (listener.valid()) serveError = receiver.start();

  // 2. Send this rank's descriptor to every peer that listens.
  fdwire::SendRow row{};
  for (int r = 0; r < n; ++r) {
    if (r == me || fd < 0) continue;
    const fdwire::Listing& peer = all[static_cast<size_t>(r)];
    if (!peer.listening) continue;
    std::string err;
    if (peer.userNs != 0 && peer.userNs == mine.userNs && peer.uid != mine.uid) {
      // Its socket would refuse this process (same user namespace: the uids compare).
      err = "rank " + std::to_string(r) + " runs as uid " + std::to_string(peer.uid) +
            " and rank " + std::to_string(me) + " as uid " + std::to_string(mine.uid) +
            ": descriptors pass only between processes of one user";
    } else {
      fdwire::FdMessage msg{fdwire::kMagic, me, {}};
      std::memcpy(msg.token, peer.token, fdwire::kTokenBytes);
      err = fdwire::sendFd(textOf(peer.name, sizeof(peer.name)), peer.listening == 1, fd, msg,
                           deadline);
    }
    if (err.empty()) {
      row.sent[r] = 1;
    } else {
      copyText(row.error[r], sizeof(row.error[r]), err);
    }
  }
  const std::vector<fdwire::SendRow> rows = bs.allGatherValue(row);

  // 3. Receive from the ranks that say they sent (a descriptor they could not send is not
  // waited for).
  std::vector<char> expected(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    const size_t i = static_cast<size_t>(r);
    const fdwire::Listing& sender = all[i];
    const fdwire::SendRow& sent = rows[i];
    if (!mine.listening) {
      out.errors[i] = "this rank could not listen: " + localError;  // in full, not as published
    } else if (!serveError.empty()) {
      out.errors[i] = "this rank could not serve its socket: " + serveError;
    } else if (!sender.hasFd) {
      out.errors[i] = "rank " + std::to_string(r) +
                      " has no descriptor: " + textOf(sender.error, sizeof(sender.error));
    } else if (!sent.sent[me]) {
      out.errors[i] = "rank " + std::to_string(r) + " could not send its descriptor here: " +
                      textOf(sent.error[me], sizeof(sent.error[me]));
    } else {
      expected[i] = 1;
    }
  }
  receiver.waitFor(expected, deadline);
  receiver.stop();
  const std::string failure = receiver.failure();
  for (int r = 0; r < n; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (!expected[i]) continue;
    out.fds[i] = receiver.take(r);
    if (out.fds[i].valid()) continue;
    out.errors[i] =
        "timed out after " + std::to_string(timeoutMs) + " ms waiting for rank " +
        std::to_string(r) + "'s descriptor" +
        (failure.empty() ? "" : " (this rank stopped serving its socket: " + failure + ")");
  }
  return out;
}

}  // namespace anyr
