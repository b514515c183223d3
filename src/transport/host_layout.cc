#include "transport/host_layout.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "device/vectors.h"

namespace anyr {

HostLayout computeHostLayout(uint64_t launchBytes, int nranks, uint64_t llMaxBytes,
                             uint64_t copyChunkBytes) {
  HostLayout l{};
  const uint64_t page = 4096;
  const uint64_t n = static_cast<uint64_t>(nranks > 0 ? nranks : 1);
  l.launchBytes = launchBytes;  // every size below follows from it
  // host-copy chunks: whole 64 KiB units, no larger than a launch, and large enough that a
  // launch has at most kMaxCopyChunks of them (one flag word each).
  const uint64_t unit = 64u << 10;
  const uint64_t fewest = roundUp((launchBytes + kMaxCopyChunks - 1) / kMaxCopyChunks, unit);
  l.copyChunkBytes =
      std::min(roundUp(launchBytes, unit), std::max({roundUp(copyChunkBytes, unit), fewest, unit}));
  l.headerOffset = 0;
  l.flagsOffset = page;
  l.dataOffset = roundUp(l.flagsOffset + sizeof(HostFlags), page);
  l.dataBytes = roundUp(launchBytes, page);
  l.resultOffset = l.dataOffset + 2 * l.dataBytes;
  // One segment (rounded up to whole block quanta, see host_twoshot.cu) plus slack.
  l.resultBytes = roundUp(launchBytes / n + (64u << 10), page);
  l.llMaxBytes = std::min(llMaxBytes, launchBytes);
  l.llOffset = l.resultOffset + 2 * l.resultBytes;
  l.llBytes = roundUp(2 * l.llMaxBytes, page);
  l.copyOffset = l.llOffset + 2 * l.llBytes;
  // Chunks of a launch end before launchBytes + one chunk (a small launch's chunks are cut
  // from its own size, and their last may pass the launch's end: hostCopyLaunchChunkBytes).
  l.copyBytes = roundUp(launchBytes + l.copyChunkBytes, page);
  l.rankBytes = roundUp(l.copyOffset + l.copyBytes, page);
  l.totalBytes = l.rankBytes * n;
  return l;
}

std::string hostCopyChunkError(uint64_t bytes) {
  if (bytes < (64u << 10) || bytes > (64u << 20) || bytes % (64u << 10) != 0) {
    return "must be a multiple of 64 KiB between 64 KiB and 64 MiB";
  }
  return "";
}

std::string hostLaunchBytesError(uint64_t bytes) {
  if (bytes < (64u << 10) || bytes > (1ull << 30) || bytes % 4096 != 0) {
    return "must be a multiple of 4096 between 64 KiB and 1 GiB";
  }
  return "";
}

HostSettings agreeHostSettings(Bootstrap& bs, int rank) {
  // One broadcast of rank 0's values (a bootstrap round trip each would add to every init).
  // The launch size travels 64 bits wide: a value past 2^31 is reported as given, not clamped.
  struct Wire {
    int32_t enabled, round, llBytes, copyChunkBytes;
    uint64_t launchBytes;
    int32_t llEagerBytes, numa;
  };
  static_assert(sizeof(Wire) == 32, "agreeHostSettings' broadcast layout");
  const uint64_t mineLaunch = env::getSize("ANYR_HOST_LAUNCH_BYTES");
  const uint64_t copyChunk = env::getSize("ANYR_HOST_COPY_CHUNK_BYTES");
  Wire w{env::getInt("ANYR_HOST_MEMORY") != 0 ? 1 : 0,
         env::getInt32("ANYR_HOST_ROUND"),
         env::getInt32("ANYR_HOST_LL_BYTES"),
         static_cast<int32_t>(std::min<uint64_t>(copyChunk, INT32_MAX)),
         mineLaunch,
         env::getInt32("ANYR_HOST_LL_EAGER_BYTES"),
         env::getInt("ANYR_HOST_NUMA") != 0 ? 1 : 0};
  bs.broadcast(&w, sizeof(w), 0);
  // Every rank checks the same (rank 0's) values, so every rank reaches the same verdict.
  const std::string launchError = hostLaunchBytesError(w.launchBytes);
  if (!launchError.empty()) {
    throwError(anyrInvalidArgument,
               "environment variable ANYR_HOST_LAUNCH_BYTES=" + std::to_string(w.launchBytes) +
                   " (rank 0's): " + launchError);
  }
  if (mineLaunch != w.launchBytes) {
    ANYR_LOG(Warn, rank,
             "this rank's ANYR_HOST_LAUNCH_BYTES=" << mineLaunch << " differs from rank 0's; using "
                                                   << w.launchBytes);
  }
  if (w.round < 1 || w.round > 64) {
    throwError(anyrInvalidArgument, "environment variable ANYR_HOST_ROUND=" +
                                        std::to_string(w.round) + " (rank 0's): must be 1..64");
  }
  for (const auto& [name, value] :
       {std::pair<const char*, int32_t>{"ANYR_HOST_LL_BYTES", w.llBytes},
        {"ANYR_HOST_LL_EAGER_BYTES", w.llEagerBytes}}) {
    if (value < 0 || value > (1 << 20) || value % 16 != 0) {
      throwError(anyrInvalidArgument, std::string("environment variable ") + name + "=" +
                                          std::to_string(value) +
                                          " (rank 0's): must be a multiple of 16 in 0..1048576");
    }
  }
  const std::string copyChunkError = hostCopyChunkError(static_cast<uint64_t>(w.copyChunkBytes));
  if (!copyChunkError.empty()) {
    throwError(anyrInvalidArgument, "environment variable ANYR_HOST_COPY_CHUNK_BYTES=" +
                                        std::to_string(w.copyChunkBytes) +
                                        " (rank 0's): " + copyChunkError);
  }
  HostSettings s;
  s.enabled = w.enabled != 0;
  s.numa = w.numa != 0;
  s.roundVecs = w.round;
  s.llBytes = static_cast<uint64_t>(w.llBytes);
  s.llEagerBytes = static_cast<uint64_t>(w.llEagerBytes);
  s.copyChunkBytes = static_cast<uint64_t>(w.copyChunkBytes);
  s.launchBytes = w.launchBytes;
  return s;
}

}  // namespace anyr
