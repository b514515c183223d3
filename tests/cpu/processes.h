// The CPU tests' multi-process harness: a child process per rank that reports through a pipe
// (result code + message) and its exit status; the parent waits with a deadline and kills
// stragglers with SIGKILL, so no test can hang. Plus a scoped environment variable and a
// unique id on loopback (ports are always 0, any free port: tests can run in parallel).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"

namespace anyr {
namespace proctest {

using Clock = std::chrono::steady_clock;

inline constexpr int kCheckFailed = 1000;  // result code a child reports for a failed check

// Thrown inside a child when one of its own checks fails.
inline void expect(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error("check failed: " + what);
}

struct ChildResult {
  bool finished = false;  // reported and exited before the deadline
  int code = -1;          // anyrResult_t the child reported (0: success), kCheckFailed, or -1
  std::string message;
  int64_t elapsedMs = 0;  // from spawn until the report arrived

  std::string describe() const {
    return (finished ? "" : "[killed or crashed] ") + std::string("code ") + std::to_string(code) +
           " after " + std::to_string(elapsedMs) + " ms: " + message;
  }
};

class Processes {
 public:
  Processes() = default;
  Processes(const Processes&) = delete;
  Processes& operator=(const Processes&) = delete;
  ~Processes() {
    for (Kid& k : kids_) {
      if (!k.reaped) {
        ::kill(k.pid, SIGKILL);
        ::waitpid(k.pid, nullptr, 0);
      }
      if (k.fd >= 0) ::close(k.fd);
    }
  }

  // Runs fn in a child process. fn returns a message on success or throws.
  size_t spawn(const std::function<std::string()>& fn) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(p[0]);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test binary
      int32_t code = 0;
      std::string msg;
      try {
        msg = fn();
      } catch (const Error& e) {
        code = static_cast<int32_t>(e.code());
        msg = e.what();
      } catch (const std::exception& e) {
        code = kCheckFailed;
        msg = e.what();
      } catch (...) {
        code = kCheckFailed;
        msg = "unknown exception";
      }
      std::string report(reinterpret_cast<const char*>(&code), sizeof(code));
      report += msg;
      size_t done = 0;
      while (done < report.size()) {
        ssize_t n = ::write(p[1], report.data() + done, report.size() - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      ::_exit(code == 0 ? 0 : 1);
    }
    ::close(p[1]);
    Kid k;
    k.pid = pid;
    k.fd = p[0];
    k.start = Clock::now();
    kids_.push_back(std::move(k));
    return kids_.size() - 1;
  }

  // Waits for every child to report and exit, at most timeoutMs in all; kills the others.
  std::vector<ChildResult> waitAll(int timeoutMs) {
    Deadline deadline(timeoutMs);
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<size_t> who;
      for (size_t i = 0; i < kids_.size(); ++i) {
        if (kids_[i].eof) continue;
        fds.push_back(pollfd{kids_[i].fd, POLLIN, 0});
        who.push_back(i);
      }
      if (fds.empty() || deadline.expired()) break;
      int n = ::poll(fds.data(), fds.size(), deadline.remainingMs());
      if (n <= 0) continue;
      for (size_t j = 0; j < fds.size(); ++j) {
        if (fds[j].revents == 0) continue;
        Kid& k = kids_[who[j]];
        char buf[4096];
        ssize_t got = ::read(k.fd, buf, sizeof(buf));
        if (got > 0) {
          k.data.append(buf, static_cast<size_t>(got));
        } else if (got == 0 || errno != EINTR) {
          k.eof = true;
          k.end = Clock::now();
        }
      }
    }
    std::vector<ChildResult> results;
    for (Kid& k : kids_) {
      ChildResult r;
      int status = 0;
      if (k.eof) {
        // It reported; it exits right after. Give it a moment, then make sure.
        for (int i = 0; i < 200 && !k.reaped; ++i) {
          if (::waitpid(k.pid, &status, WNOHANG) == k.pid) {
            k.reaped = true;
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        }
      }
      if (!k.reaped) {
        ::kill(k.pid, SIGKILL);
        ::waitpid(k.pid, &status, 0);
        k.reaped = true;
        r.message = "(killed at the test deadline) ";
      }
      if (!k.eof) k.end = Clock::now();
      r.elapsedMs = std::chrono::duration_cast<std::chrono::milliseconds>(k.end - k.start).count();
      if (k.data.size() >= sizeof(int32_t)) {
        int32_t code;
        std::memcpy(&code, k.data.data(), sizeof(code));
        r.code = code;
        r.message += k.data.substr(sizeof(code));
        r.finished = WIFEXITED(status) && WEXITSTATUS(status) == (code == 0 ? 0 : 1);
      } else if (WIFSIGNALED(status)) {
        r.message += "died of signal " + std::to_string(WTERMSIG(status));
      }
      results.push_back(r);
    }
    return results;
  }

 private:
  struct Kid {
    pid_t pid = -1;
    int fd = -1;
    std::string data;
    bool eof = false;
    bool reaped = false;
    Clock::time_point start;
    Clock::time_point end;
  };
  std::vector<Kid> kids_;
};

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Sets (or unsets, for nullptr) an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    hadOld_ = old != nullptr;
    if (hadOld_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (hadOld_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool hadOld_ = false;
  std::string old_;
};

// A unique id on loopback whatever the environment of the test runner says.
inline anyrUniqueId loopbackId() {
  ScopedEnv a("ANYR_SOCKET_ADDR", nullptr);
  ScopedEnv i("ANYR_SOCKET_IFNAME", nullptr);
  ScopedEnv p("ANYR_SOCKET_PORT", nullptr);
  anyrUniqueId id;
  createUniqueId(&id);
  return id;
}

// n ranks of a TCP bootstrap on `id`, each in a process of its own: body(bootstrap, rank) runs
// once createTcpBootstrap (every wait bounded by timeoutMs) returned, and its message is the
// rank's; the results once every rank reported or waitMs passed.
inline std::vector<ChildResult> runTcpRanks(
    const anyrUniqueId& id, int n, int timeoutMs, int waitMs,
    const std::function<std::string(Bootstrap& bs, int rank)>& body) {
  Processes procs;
  for (int r = 0; r < n; ++r) {
    procs.spawn([&, r]() -> std::string {
      auto bs = createTcpBootstrap(id, r, n, timeoutMs);
      return body(*bs, r);
    });
  }
  return procs.waitAll(waitMs);
}

}  // namespace proctest
}  // namespace anyr
