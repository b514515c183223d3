// libanyreduce_nccl.so over a test double of the real NCCL (nccl_double.cc, which records every
// call it receives with its arguments): what reaches the real library, and what comes back.
// No GPU is needed. Each test runs in a child process of its own (the library reads its
// environment and loads the real NCCL once per process), with its stderr in a file.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "call_format.h"

namespace {

using anyrn_test::formatArgs;
using anyrn_test::formatCall;

// The functions of libanyreduce_nccl.so the tests call, looked up by name.
#define SHIM_FUNCTIONS(X)  \
  X(ncclGetVersion)        \
  X(ncclGetUniqueId)       \
  X(ncclCommInitRank)      \
  X(ncclCommFinalize)      \
  X(ncclCommDestroy)       \
  X(ncclCommAbort)         \
  X(ncclCommGetAsyncError) \
  X(ncclGetErrorString)    \
  X(ncclGetLastError)      \
  X(ncclAllReduce)         \
  X(ncclAllGather)         \
  X(ncclBroadcast)         \
  X(ncclReduceScatter)     \
  X(ncclSend)              \
  X(ncclRecv)              \
  X(ncclGroupStart)        \
  X(ncclGroupEnd)          \
  X(ncclMemFree)           \
  X(pncclAllGather)        \
  X(pncclMemFree)

struct Shim {
  void* handle = nullptr;
#define SHIM_MEMBER(name) decltype(&::name) name = nullptr;
  SHIM_FUNCTIONS(SHIM_MEMBER)
#undef SHIM_MEMBER
};

// What a child's checks found: one line per check that failed.
class Checks {
 public:
  void expect(bool ok, const std::string& what) {
    if (!ok) failures_ += what + "\n";
  }
  const std::string& failures() const { return failures_; }

 private:
  std::string failures_;
};

struct Outcome {
  std::string failures;  // the child's failed checks ("" when every one held)
  std::string log;       // what the double recorded
  std::string err;       // the child's stderr
  int status = -1;       // its wait status
};

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  std::string line;
  while (std::getline(s, line)) out.push_back(line);
  return out;
}

// Runs `body` in a child process with `env` set (ANYR_NCCL_LIBRARY defaults to the double), the
// double recording to a fresh file and stderr going to another.
Outcome runInChild(const std::vector<std::pair<std::string, std::string>>& env,
                   const std::function<void(Shim&, Checks&)>& body) {
  char dir[] = "/tmp/anyrn_test_XXXXXX";
  if (mkdtemp(dir) == nullptr) return {"mkdtemp failed\n", "", "", -1};
  const std::string log = std::string(dir) + "/calls.log";
  const std::string err = std::string(dir) + "/stderr.txt";
  int fds[2];
  if (pipe(fds) != 0) return {"pipe failed\n", "", "", -1};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    setenv("ANYR_NCCL_LIBRARY", ANYRN_TEST_DOUBLE, 1);
    setenv("NCCL_DOUBLE_LOG", log.c_str(), 1);
    for (const auto& kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    const int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    Checks checks;
    Shim shim;
    shim.handle = dlopen(ANYRN_TEST_SHIM, RTLD_NOW | RTLD_LOCAL);
    if (shim.handle == nullptr) checks.expect(false, std::string("dlopen: ") + dlerror());
    if (shim.handle != nullptr) {
#define SHIM_LOOKUP(name)                                                     \
  shim.name = reinterpret_cast<decltype(&::name)>(dlsym(shim.handle, #name)); \
  checks.expect(shim.name != nullptr, "the library does not export " #name);
      SHIM_FUNCTIONS(SHIM_LOOKUP)
#undef SHIM_LOOKUP
      if (checks.failures().empty()) body(shim, checks);
    }
    const std::string& f = checks.failures();
    ssize_t done = 0;
    while (done < static_cast<ssize_t>(f.size())) {
      const ssize_t n = write(fds[1], f.data() + done, f.size() - done);
      if (n <= 0) break;
      done += n;
    }
    _exit(0);
  }
  close(fds[1]);
  Outcome out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.failures.append(buf, n);
  close(fds[0]);
  waitpid(pid, &out.status, 0);
  out.log = readFile(log);
  out.err = readFile(err);
  unlink(log.c_str());
  unlink(err.c_str());
  rmdir(dir);
  return out;
}

void expectExited(const Outcome& o) {
  EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) == 0)
      << "the child did not exit normally (status " << o.status << "); stderr:\n"
      << o.err;
  EXPECT_EQ(o.failures, "") << "stderr of the child:\n" << o.err << "\ncalls:\n" << o.log;
}

// Our log lines of level `level` ("WARN" or "INFO") in a child's stderr.
std::vector<std::string> ourLines(const std::string& err, const std::string& level) {
  std::vector<std::string> out;
  for (const std::string& l : lines(err)) {
    if (l.rfind("anyreduce-nccl[", 0) == 0 && l.find("] " + level + " ") != std::string::npos) {
      out.push_back(l);
    }
  }
  return out;
}

bool anyreduceLoaded() { return dlopen("libanyreduce.so.0", RTLD_LAZY | RTLD_NOLOAD) != nullptr; }

void* ptr(uintptr_t v) { return reinterpret_cast<void*>(v); }
cudaStream_t fakeStream() { return reinterpret_cast<cudaStream_t>(0x3000); }
ncclComm_t commOfRank(int rank) { return reinterpret_cast<ncclComm_t>(0x10000 + 16 * rank); }

TEST(NcclForwarding, CallsReachTheRealLibraryUnchanged) {
  std::vector<std::string> expected;
  const Outcome o = runInChild({}, [&](Shim& s, Checks& c) {
    int version = 0;
    c.expect(s.ncclGetVersion(&version) == ncclSuccess, "ncclGetVersion failed");
    expected.push_back(formatCall("ncclGetVersion", formatArgs(&version)));
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    c.expect(s.ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
    expected.push_back(formatCall("ncclGetUniqueId", formatArgs(&id)));
    ncclComm_t comm = nullptr;
    c.expect(s.ncclCommInitRank(&comm, 2, id, 1) == ncclSuccess, "ncclCommInitRank failed");
    expected.push_back(formatCall("ncclCommInitRank", formatArgs(&comm, 2, id, 1)));
    c.expect(comm == commOfRank(1), "ncclCommInitRank did not return the real communicator");

    const void* send = ptr(0x1000);
    void* recv = ptr(0x2000);
    cudaStream_t st = fakeStream();
    c.expect(s.ncclAllGather(send, recv, 10, ncclFloat, comm, st) == ncclSuccess, "allgather");
    expected.push_back(
        formatCall("ncclAllGather", formatArgs(send, recv, 10, ncclFloat, comm, st)));
    // All-reduces anyreduce does not serve: another op, another data type.
    c.expect(s.ncclAllReduce(send, recv, 64, ncclFloat, ncclMax, comm, st) == ncclSuccess, "max");
    expected.push_back(
        formatCall("ncclAllReduce", formatArgs(send, recv, 64, ncclFloat, ncclMax, comm, st)));
    c.expect(s.ncclAllReduce(send, recv, 64, ncclInt32, ncclSum, comm, st) == ncclSuccess, "int");
    expected.push_back(
        formatCall("ncclAllReduce", formatArgs(send, recv, 64, ncclInt32, ncclSum, comm, st)));
    // An eligible all-reduce inside a group: forwarded, no setup.
    c.expect(s.ncclGroupStart() == ncclSuccess, "ncclGroupStart failed");
    expected.push_back(formatCall("ncclGroupStart", formatArgs()));
    c.expect(s.ncclAllReduce(send, recv, 64, ncclFloat, ncclSum, comm, st) == ncclSuccess,
             "grouped all-reduce");
    expected.push_back(
        formatCall("ncclAllReduce", formatArgs(send, recv, 64, ncclFloat, ncclSum, comm, st)));
    c.expect(s.ncclGroupEnd() == ncclSuccess, "ncclGroupEnd failed");
    expected.push_back(formatCall("ncclGroupEnd", formatArgs()));
    // The profiling twin is the same function.
    c.expect(s.pncclAllGather(send, recv, 3, ncclHalf, comm, st) == ncclSuccess, "pncclAllGather");
    expected.push_back(formatCall("ncclAllGather", formatArgs(send, recv, 3, ncclHalf, comm, st)));
    c.expect(s.ncclBroadcast(send, recv, 5, ncclBfloat16, 1, comm, st) == ncclSuccess, "bcast");
    expected.push_back(
        formatCall("ncclBroadcast", formatArgs(send, recv, 5, ncclBfloat16, 1, comm, st)));
    c.expect(s.ncclReduceScatter(send, recv, 7, ncclFloat, ncclSum, comm, st) == ncclSuccess,
             "reduce-scatter");
    expected.push_back(
        formatCall("ncclReduceScatter", formatArgs(send, recv, 7, ncclFloat, ncclSum, comm, st)));
    c.expect(s.ncclSend(send, 9, ncclInt8, 0, comm, st) == ncclSuccess, "send");
    expected.push_back(formatCall("ncclSend", formatArgs(send, 9, ncclInt8, 0, comm, st)));
    c.expect(s.ncclRecv(recv, 9, ncclInt8, 0, comm, st) == ncclSuccess, "recv");
    expected.push_back(formatCall("ncclRecv", formatArgs(recv, 9, ncclInt8, 0, comm, st)));
    ncclResult_t async = ncclInternalError;
    c.expect(s.ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess,
             "ncclCommGetAsyncError");
    expected.push_back(formatCall("ncclCommGetAsyncError", formatArgs(comm, &async)));
    c.expect(std::string(s.ncclGetErrorString(ncclInvalidUsage)) == "double: error 5",
             "ncclGetErrorString is not the real library's");
    expected.push_back(formatCall("ncclGetErrorString", formatArgs(ncclInvalidUsage)));
    c.expect(s.ncclCommFinalize(comm) == ncclSuccess, "ncclCommFinalize failed");
    expected.push_back(formatCall("ncclCommFinalize", formatArgs(comm)));
    c.expect(s.ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy failed");
    expected.push_back(formatCall("ncclCommDestroy", formatArgs(comm)));
    // No eligible call outside a group: libanyreduce was never loaded.
    c.expect(!anyreduceLoaded(), "libanyreduce was loaded although nothing could be served");
    // The recorded calls, checked here: `expected` lives in the child.
    const std::vector<std::string> got = lines(readFile(std::getenv("NCCL_DOUBLE_LOG")));
    c.expect(got == expected, "the real library did not receive exactly the calls made");
  });
  expectExited(o);
  EXPECT_TRUE(ourLines(o.err, "WARN").empty()) << o.err;
}

TEST(NcclForwarding, GetVersionIsTheRealLibrarysVersion) {
  const Outcome o = runInChild({{"NCCL_DOUBLE_VERSION", "21805"}}, [](Shim& s, Checks& c) {
    int version = 0;
    c.expect(s.ncclGetVersion(&version) == ncclSuccess, "ncclGetVersion failed");
    c.expect(version == 21805,
             "ncclGetVersion gave " + std::to_string(version) + ", the real library says 21805");
    c.expect(version != NCCL_VERSION_CODE, "the double's version must differ from the header's");
  });
  expectExited(o);
}

// With no GPU, every setup fails before its first collective step (CUDA cannot be used here),
// and with a GPU it fails in anyrCommInitFromNccl (the double moves no data): either way the
// all-reduce reaches the real library unchanged, after one log line, and so do the later ones.
TEST(NcclForwarding, AnEligibleAllReduceWhoseTwinCannotBeSetUpIsForwardedAfterOneLogLine) {
  const Outcome o = runInChild({{"ANYR_TIMEOUT_MS", "3000"}}, [](Shim& s, Checks& c) {
    ncclUniqueId id;
    c.expect(s.ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
    ncclComm_t comm = nullptr;
    c.expect(s.ncclCommInitRank(&comm, 2, id, 0) == ncclSuccess, "ncclCommInitRank failed");
    std::vector<std::string> user;
    const void* send = ptr(0x1000);
    void* recv = ptr(0x2000);
    cudaStream_t st = nullptr;  // a stream CUDA accepts where there is a GPU
    for (int i = 0; i < 3; ++i) {
      c.expect(s.ncclAllReduce(send, recv, 1024, ncclFloat, ncclSum, comm, st) == ncclSuccess,
               "an eligible all-reduce failed");
      user.push_back(
          formatCall("ncclAllReduce", formatArgs(send, recv, 1024, ncclFloat, ncclSum, comm, st)));
    }
    c.expect(s.ncclAllReduce(recv, recv, 77, ncclBfloat16, ncclSum, comm, st) == ncclSuccess,
             "an eligible bf16 all-reduce failed");
    user.push_back(
        formatCall("ncclAllReduce", formatArgs(recv, recv, 77, ncclBfloat16, ncclSum, comm, st)));
    ncclResult_t async = ncclInternalError;
    c.expect(s.ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess,
             "ncclCommGetAsyncError reports an error");
    c.expect(s.ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy failed");
    user.push_back(formatCall("ncclCommDestroy", formatArgs(comm)));
    // The application's calls arrived unchanged and in order (the setup's own calls, on the
    // double's communicators or its own buffers, may sit between them).
    size_t next = 0;
    for (const std::string& line : lines(readFile(std::getenv("NCCL_DOUBLE_LOG")))) {
      if (next < user.size() && line == user[next]) ++next;
    }
    c.expect(next == user.size(), "the real library did not receive call " +
                                      (next < user.size() ? user[next] : std::string()));
  });
  expectExited(o);
  const std::vector<std::string> warns = ourLines(o.err, "WARN");
  EXPECT_EQ(warns.size(), 1u) << o.err;
}

// libanyreduce's own NCCL calls (its NCCL path, say, on a communicator of its own) are never
// served by a twin: an eligible all-reduce made from a library exporting anyrCommInitFromNccl
// is forwarded with no setup.
TEST(NcclForwarding, CallsFromLibanyreduceAreForwardedAsTheyAre) {
  const Outcome o = runInChild({}, [](Shim& s, Checks& c) {
    void* fake = dlopen(ANYRN_TEST_FAKE_ANYREDUCE, RTLD_NOW | RTLD_LOCAL);
    if (fake == nullptr) {
      c.expect(false, std::string("dlopen: ") + dlerror());
      return;
    }
    using CallFn =
        ncclResult_t (*)(decltype(&::ncclAllReduce), const void*, void*, size_t, ncclComm_t);
    auto call = reinterpret_cast<CallFn>(dlsym(fake, "fakeAnyreduceAllReduce"));
    c.expect(call != nullptr, "the fake libanyreduce has no fakeAnyreduceAllReduce");
    if (call == nullptr) return;
    const ncclComm_t comm = commOfRank(0);
    for (int i = 0; i < 2; ++i) {
      c.expect(call(s.ncclAllReduce, ptr(0x1000), ptr(0x2000), 512, comm) == ncclSuccess,
               "the all-reduce failed");
    }
    const std::string line =
        formatCall("ncclAllReduce", formatArgs(ptr(0x1000), ptr(0x2000), 512, ncclFloat, ncclSum,
                                               comm, static_cast<cudaStream_t>(nullptr)));
    const std::vector<std::string> got = lines(readFile(std::getenv("NCCL_DOUBLE_LOG")));
    c.expect(got == std::vector<std::string>{line, line},
             "the real library did not receive exactly the two all-reduces");
    c.expect(!anyreduceLoaded(), "libanyreduce was loaded for a call of libanyreduce's own");
  });
  expectExited(o);
  EXPECT_TRUE(ourLines(o.err, "WARN").empty()) << o.err;
}

TEST(NcclForwarding, ServingOffForwardsEverythingWithoutLoadingAnyreduce) {
  for (const char* value : {"0", "no"}) {
    const Outcome o = runInChild({{"ANYR_NCCL_SERVE", value}}, [](Shim& s, Checks& c) {
      ncclComm_t comm = nullptr;
      ncclUniqueId id;
      c.expect(s.ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
      c.expect(s.ncclCommInitRank(&comm, 2, id, 0) == ncclSuccess, "ncclCommInitRank failed");
      const void* send = ptr(0x1000);
      void* recv = ptr(0x2000);
      c.expect(s.ncclAllReduce(send, recv, 1024, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess,
               "the all-reduce failed");
      const std::string call = formatCall(
          "ncclAllReduce", formatArgs(send, recv, 1024, ncclFloat, ncclSum, comm, nullptr));
      const std::vector<std::string> got = lines(readFile(std::getenv("NCCL_DOUBLE_LOG")));
      c.expect(got.size() == 3 && got[2] == call, "the all-reduce did not arrive as it was made");
      c.expect(!anyreduceLoaded(), "libanyreduce was loaded with serving off");
    });
    expectExited(o);
    // "0" is silent; anything but 0 or 1 says once that serving is off.
    EXPECT_EQ(ourLines(o.err, "WARN").size(), std::string(value) == "0" ? 0u : 1u) << o.err;
  }
}

TEST(NcclForwarding, ThisLibraryIsNeverTakenForTheRealOne) {
  const Outcome o = runInChild({{"ANYR_NCCL_LIBRARY", ANYRN_TEST_SHIM}}, [](Shim& s, Checks& c) {
    int version = 0;
    c.expect(s.ncclGetVersion(&version) == ncclSystemError, "ncclGetVersion did not fail");
    const std::string msg = s.ncclGetLastError(nullptr);
    c.expect(msg.find("is this library itself") != std::string::npos,
             "ncclGetLastError does not say why: " + msg);
    c.expect(s.ncclAllReduce(ptr(0x1000), ptr(0x2000), 8, ncclFloat, ncclSum,
                             reinterpret_cast<ncclComm_t>(0x10000), nullptr) == ncclSystemError,
             "an all-reduce without a real library did not fail");
    c.expect(s.ncclGetErrorString(ncclSystemError) != nullptr, "ncclGetErrorString gave NULL");
  });
  expectExited(o);
}

TEST(NcclForwarding, AMissingRealLibraryFailsEveryCallNamingIt) {
  const char* path = "/nonexistent/libnccl.so.2";
  const Outcome o = runInChild({{"ANYR_NCCL_LIBRARY", path}}, [&](Shim& s, Checks& c) {
    ncclUniqueId id;
    c.expect(s.ncclGetUniqueId(&id) == ncclSystemError, "ncclGetUniqueId did not fail");
    const std::string msg = s.ncclGetLastError(nullptr);
    c.expect(msg.find(path) != std::string::npos, "ncclGetLastError does not name it: " + msg);
  });
  expectExited(o);
  EXPECT_EQ(ourLines(o.err, "WARN").size(), 1u) << o.err;
}

// A function the real library lacks fails as ours; ncclGetLastError then gives our message,
// and the real library's again once the real library failed last.
TEST(NcclForwarding, LastErrorIsOursOnlyWhenTheLastFailureWasOurs) {
  const Outcome o = runInChild({}, [](Shim& s, Checks& c) {
    c.expect(s.ncclMemFree(ptr(0x1000)) == ncclInvalidUsage, "ncclMemFree did not fail");
    std::string msg = s.ncclGetLastError(nullptr);
    c.expect(msg.find("ncclMemFree is not in the real NCCL library") != std::string::npos,
             "ncclGetLastError after ncclMemFree: " + msg);
    c.expect(s.pncclMemFree(ptr(0x1000)) == ncclInvalidUsage, "pncclMemFree did not fail");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    ncclComm_t comm = nullptr;
    c.expect(s.ncclCommInitRank(&comm, 0, id, 0) == ncclInvalidArgument,
             "the real library's failure did not come back");
    msg = s.ncclGetLastError(nullptr);
    c.expect(msg == "double: bad nranks", "ncclGetLastError after the real failure: " + msg);
  });
  expectExited(o);
}

}  // namespace
