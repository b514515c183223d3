// Host-side collective exchange among the ranks of one communicator. Used at init (and for
// control messages) only, never on the data path. Every call is bounded by the deadline
// given at creation; an expired wait throws anyrTimeout naming the rank(s) waited for.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank contributes `bytes` bytes (the same number on every rank); `out` receives
  // size() * bytes bytes in rank order. `in` and `out` may not overlap.
  virtual void allGather(const void* in, void* out, size_t bytes) = 0;
  virtual void barrier() = 0;
  // Convenience built on allGather.
  void broadcast(void* buf, size_t bytes, int root);
  template <typename T>
  std::vector<T> allGatherValue(const T& v) {
    std::vector<T> out(static_cast<size_t>(size()));
    allGather(&v, out.data(), sizeof(T));
    return out;
  }
};

// Fills `id` with rank 0's address, a port and a fresh random secret; binds and listens on
// that port and keeps the socket for a later createTcpBootstrap(rank 0) in this process.
void createUniqueId(anyrUniqueId* id);

// TCP rendezvous (star through rank 0). timeoutMs bounds every wait, including the wait for
// all ranks to arrive.
std::unique_ptr<Bootstrap> createTcpBootstrap(const anyrUniqueId& id, int rank, int nranks,
                                              int timeoutMs);

// Exchange through an existing NCCL communicator (ncclComm_t as void*), for servers that
// already hold one. Works on the NCCL communicator's device (whatever is current) with a
// private stream, which it synchronizes, bounded by the timeout.
std::unique_ptr<Bootstrap> createNcclBootstrap(void* ncclComm, int timeoutMs);

}  // namespace anyr
