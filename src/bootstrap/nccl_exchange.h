// How the bootstrap through an NCCL communicator (anyrCommInitFromNccl,
// src/bootstrap/nccl_bootstrap.cc) names the ranks an exchange waited for. Pure functions,
// tested on the CPU (tests/cpu/test_nccl_exchange.cc).
//
// NCCL never says which rank is missing from a collective: an all-gather that one rank never
// joins just does not complete. But the all-gather writes each rank's contribution into that
// rank's slot of the output as it arrives. So every contribution starts with a header (magic,
// rank, exchange number); when an exchange overruns the timeout, the rank copies the slots'
// headers from the device on a second stream (the first one is held by NCCL's kernel) and names
// the ranks whose header has not arrived. A header that arrived proves that rank called. One
// that did not arrive names a rank that did not call, or one the missing rank held back: NCCL
// passes contributions along a ring, so each rank receives those of the ranks before it in ring
// order up to the missing one. With two ranks the name is exact; with more it is a set that
// contains the missing rank.
//
// Point-to-point operations could name the missing rank exactly, but their first use makes
// NCCL connect to that peer, and on a blocking NCCL communicator that connection blocks inside
// NCCL until the peer joins: no timeout of ours applies there. The all-gather needs only the
// connections a server's first collectives already made.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anyr {
namespace ncclexchange {

// The first bytes of every rank's contribution. Fixed layout: crosses processes.
struct Header {
  uint64_t magic = 0;
  int32_t rank = -1;
  uint32_t seq = 0;  // the exchange's number on this bootstrap, from 1
};
static_assert(sizeof(Header) == 16, "Header crosses processes: fixed layout");

constexpr uint64_t kMagic = 0x68637865726e7961ull;  // "anyrexch" (little-endian)

// The ranks whose slot does not hold their header for exchange `seq` (headers[r]: slot r).
std::vector<int> notArrived(const std::vector<Header>& headers, uint32_t seq);

// Rank `rank`'s message when exchange `seq` did not complete within timeoutMs. `started`: NCCL
// accepted the all-gather (false: it was still connecting to its peers, which a rank that does
// not call never completes). `missing`: the ranks whose contribution had not arrived, when the
// headers could be read (`known`). seq 1 is the exchange that opens anyrCommInitFromNccl.
std::string timeoutMessage(int rank, int nranks, int timeoutMs, uint32_t seq, bool started,
                           bool known, const std::vector<int>& missing);

// After a completed exchange: "" when every slot holds its rank's header for `seq`; otherwise
// what arrived instead (another operation on the NCCL communicator paired with the exchange).
std::string checkHeaders(const std::vector<Header>& headers, uint32_t seq);

}  // namespace ncclexchange
}  // namespace anyr
