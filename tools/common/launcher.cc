#include "common/launcher.h"

#include <cuda_runtime_api.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace anyr {
namespace launch {

namespace {

using Clock = std::chrono::steady_clock;

// Moves n bytes through io(c, left) (one read or write: the bytes moved, <0 with errno, or 0
// at the end), retrying EINTR; false at the end or on an error before all n moved.
template <typename C, typename Io>
bool moveAll(C* c, size_t n, Io io) {
  while (n > 0) {
    ssize_t k = io(c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool writeAll(int fd, const void* p, size_t n) {
  return moveAll(static_cast<const char*>(p), n,
                 [&](const char* c, size_t left) { return ::write(fd, c, left); });
}

// Reads exactly n bytes before the deadline.
bool readAll(int fd, void* p, size_t n, Clock::time_point deadline) {
  return moveAll(static_cast<char*>(p), n, [&](char* c, size_t left) -> ssize_t {
    int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (ms <= 0) return 0;
    pollfd pfd{fd, POLLIN, 0};
    int pr = ::poll(&pfd, 1, ms);
    if (pr <= 0) return pr;  // <0 with EINTR: polled again; 0: the deadline passed
    return ::read(fd, c, left);
  });
}

void drain(int fd, std::string* out) {
  char buf[4096];
  while (true) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 0) <= 0) return;
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r <= 0) return;
    out->append(buf, static_cast<size_t>(r));
  }
}

}  // namespace

std::vector<RankResult> runRanks(int nranks, const RankMain& body, double timeoutSec) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeoutSec * 1000));
  std::vector<RankResult> results(static_cast<size_t>(nranks));
  std::vector<pid_t> pids(static_cast<size_t>(nranks), -1);
  std::vector<int> reportRead(static_cast<size_t>(nranks), -1);
  std::vector<int> idWrite(static_cast<size_t>(nranks), -1);
  int idFromRank0[2] = {-1, -1};
  if (::pipe(idFromRank0) != 0) {
    for (auto& r : results) r.message = "pipe failed";
    return results;
  }
  for (int r = 0; r < nranks; ++r) {
    results[static_cast<size_t>(r)].rank = r;
    int rep[2], idp[2];
    if (::pipe(rep) != 0 || ::pipe(idp) != 0) {
      results[static_cast<size_t>(r)].message = "pipe failed";
      continue;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid == 0) {
      // Child.
      ::close(rep[0]);
      ::close(idp[1]);
      ::close(idFromRank0[0]);
      for (int q = 0; q < r; ++q) {
        if (reportRead[static_cast<size_t>(q)] >= 0) ::close(reportRead[static_cast<size_t>(q)]);
        if (idWrite[static_cast<size_t>(q)] >= 0) ::close(idWrite[static_cast<size_t>(q)]);
      }
      const int repFd = rep[1];
      auto report = [repFd](const std::string& s) { writeAll(repFd, s.data(), s.size()); };
      anyrUniqueId id{};
      if (r == 0) {
        anyrResult_t res = anyrGetUniqueId(&id);
        if (res != anyrSuccess) {
          report(std::string("anyrGetUniqueId: ") + anyrGetLastError(nullptr));
          ::_exit(90);
        }
        writeAll(idFromRank0[1], &id, sizeof(id));
      } else if (!readAll(idp[0], &id, sizeof(id), deadline)) {
        report("did not receive the unique id from the launcher");
        ::_exit(91);
      }
      ::close(idFromRank0[1]);
      int code = 99;
      try {
        code = body(r, nranks, id, report);
      } catch (const std::exception& e) {
        report(std::string("uncaught exception: ") + e.what());
        code = 98;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    ::close(rep[1]);
    ::close(idp[0]);
    if (pid < 0) {
      results[static_cast<size_t>(r)].message = std::string("fork failed: ") + std::strerror(errno);
      ::close(rep[0]);
      ::close(idp[1]);
      continue;
    }
    pids[static_cast<size_t>(r)] = pid;
    reportRead[static_cast<size_t>(r)] = rep[0];
    idWrite[static_cast<size_t>(r)] = idp[1];
  }
  ::close(idFromRank0[1]);

  // Relay rank 0's id to the others.
  anyrUniqueId id{};
  if (readAll(idFromRank0[0], &id, sizeof(id), deadline)) {
    for (int r = 1; r < nranks; ++r) {
      if (idWrite[static_cast<size_t>(r)] >= 0)
        writeAll(idWrite[static_cast<size_t>(r)], &id, sizeof(id));
    }
  }
  ::close(idFromRank0[0]);

  // Wait for all children; kill everything at the deadline.
  int alive = 0;
  for (pid_t p : pids) alive += p > 0 ? 1 : 0;
  while (alive > 0) {
    for (int r = 0; r < nranks; ++r) {
      pid_t& pid = pids[static_cast<size_t>(r)];
      if (reportRead[static_cast<size_t>(r)] >= 0)
        drain(reportRead[static_cast<size_t>(r)], &results[static_cast<size_t>(r)].message);
      if (pid <= 0) continue;
      int status = 0;
      pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) {
        RankResult& rr = results[static_cast<size_t>(r)];
        if (WIFEXITED(status)) rr.exitCode = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) rr.signal = WTERMSIG(status);
        pid = -1;
        --alive;
      }
    }
    if (alive == 0) break;
    if (Clock::now() > deadline) {
      for (int r = 0; r < nranks; ++r) {
        pid_t& pid = pids[static_cast<size_t>(r)];
        if (pid > 0) {
          ::kill(pid, SIGKILL);
          int status = 0;
          ::waitpid(pid, &status, 0);
          results[static_cast<size_t>(r)].timedOut = true;
          pid = -1;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < nranks; ++r) {
    if (reportRead[static_cast<size_t>(r)] >= 0) {
      drain(reportRead[static_cast<size_t>(r)], &results[static_cast<size_t>(r)].message);
      ::close(reportRead[static_cast<size_t>(r)]);
    }
    if (idWrite[static_cast<size_t>(r)] >= 0) ::close(idWrite[static_cast<size_t>(r)]);
  }
  return results;
}

int countGpus(std::string* why) {
  int p[2];
  if (::pipe(p) != 0) {
    if (why) *why = "pipe failed";
    return 0;
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    // The library's first-contact check: the driver, the GPUs, and whether this build's
    // kernels load on each; "<count> <result> <message>".
    int n = 0;
    const anyrResult_t r = anyrCheckDevices(&n);
    std::string msg = std::to_string(r == anyrSuccess ? n : 0) + " " + std::to_string(r) + " ";
    msg += r == anyrSuccess ? "ok" : anyrGetLastError(nullptr);
    writeAll(p[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(p[1]);
  std::string out;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd pfd{p[0], POLLIN, 0};
    if (::poll(&pfd, 1, 100) > 0) {
      ssize_t r = ::read(p[0], buf, sizeof(buf));
      if (r <= 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
  }
  ::close(p[0]);
  int status = 0;
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  int n = 0;
  int result = 0;
  int used = 0;
  if (std::sscanf(out.c_str(), "%d %d %n", &n, &result, &used) < 2 || used <= 0) {
    if (why) *why = "could not query CUDA (the check's process said nothing within 60 s)";
    return 0;
  }
  std::string text = out.substr(static_cast<size_t>(used));
  const std::string prefix = "anyrCheckDevices: ";
  if (text.compare(0, prefix.size(), prefix) == 0) text = text.substr(prefix.size());
  if (why) *why = text;
  return result == anyrSuccess ? n : 0;
}

std::string describeFailures(const std::vector<RankResult>& results) {
  std::string s;
  for (const RankResult& r : results) {
    if (r.exitCode == 0 && !r.timedOut && r.signal == 0) continue;
    s += "rank " + std::to_string(r.rank) + ": ";
    if (r.timedOut) {
      s += "killed at the deadline";
    } else if (r.signal) {
      s += "killed by signal " + std::to_string(r.signal);
    } else {
      s += "exit " + std::to_string(r.exitCode);
    }
    if (!r.message.empty()) s += ": " + r.message;
    s += "\n";
  }
  return s;
}

}  // namespace launch
}  // namespace anyr
