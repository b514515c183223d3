// Host copy: one-shot all-reduce through pinned shared host memory, the bytes moved by the copy
// engines instead of the SMs (SM loads from host memory are latency-bound; a copy engine
// streams a PCIe Gen5 x16 link at ~53 GB/s each way, and the device-to-host and host-to-device
// engines run at once).
//
// One launch (a piece of at most layout.launchBytes; larger messages are several launches) is
// cut into chunks (layout.copyChunkBytes, or a quarter of a smaller launch: host_handles.h's
// hostCopyLaunchChunkBytes); chunk c sits at c x chunk bytes in every rank's copy buffer (its
// region's copyOffset) and in the device staging. The caller's stream forks four side streams,
// so that each copy engine's copies run back to back, never waiting for a kernel between them:
//   d2h:  the launch barrier (below), then per chunk c one copy of the own chunk into the own
//         copy buffer (compressed wire: of its quantized form, which a pack kernel per chunk
//         made on the caller's stream after the fork, each followed by an event the copy waits
//         for: packing is fast, so the copies still run back to back), and an event;
//   sig:  per chunk c, after d2h's chunk-c event, a signal kernel raising the own flag copy[c]
//         to the chunk's use count (below);
//   poll: per chunk c, a wait kernel (bounded, Waiter) for every peer's copy[c], and an event;
//   h2d:  per chunk c, after poll's chunk-c event, one copy per peer of its chunk into the
//         device receive staging, and an event;
//   the caller's stream: per chunk c, after h2d's chunk-c event (and, when the output overlaps
//         the input, d2h's), a reduction kernel summing in rank order 0..n-1 in fp32 (the own
//         input for the own term; with a compressed wire the dequantized value of what this
//         rank sent, as every peer decodes it), so every rank gets the same bits, and with the
//         native wire the bits of every other algorithm. The last chunk's reduction also waits
//         for sig's last flag (sig waited for every d2h copy; h2d for every poll wait): the
//         side streams are joined back, and it advances the epoch and the counts below.
// Fork and join are events, so the whole call is capturable in a CUDA graph.
//
// Counts. The flags carry counts kept on the device (so a replayed graph gets fresh values) in
// the transport's LocalState: copyReady the number of this host-copy launch (copyLaunches + 1),
// copy[c] the number of launches that used chunk c (copyUse[c] + 1). Every rank runs the same
// launches cut into the same chunks, so its counts equal its peers'. Every kernel of a launch
// reads the same values; only the last reduction, which runs after every other kernel of the
// launch, advances them (and the epoch, syncEpoch, which the other host algorithms' buffer
// parity follows). A flag is thus either the count its waiter wants or one less, however long
// its chunk sat unused; with the epoch, which advances at every host launch, a chunk unused
// for 2^31 launches (messages that stayed small) would have read its old flag as raised.
//
// Buffer reuse. The addresses the copies use are fixed when they are issued (a graph replays
// them), so the copy buffer cannot alternate with the epoch's parity as the other host
// algorithms' buffers do: there is one, and its reuse is guarded instead. A launch starts (on
// the d2h stream, before its first copy) with a barrier: raise the own copyReady flag to the
// launch's number, wait until every peer's reached it. A rank raises it only after its previous
// launch joined back into its stream, i.e. after its copies out of every peer's buffer completed;
// so once the barrier passes, no peer still reads this rank's buffer, and it may be overwritten.
// Nor can a peer be two launches ahead (its next barrier needs this rank's flag). The device
// staging is only touched between the fork and the join of one launch on one rank. Switching
// between host algorithms stays safe: the barrier also waits for the peers' previous launch of
// host-oneshot/-twoshot, and the epoch advances per launch whichever algorithm ran, so their
// parity argument (host_oneshot.cu) sees host-copy launches as launches that completed.
//
// Visibility. A signal kernel starts only after its chunk's device-to-host copy completed (sig
// waits for d2h's event), and a completed copy to host memory has landed there: it is the
// point at which a host thread synchronizing on the same event may read the bytes. The kernel
// then fences at system scope and stores its flag with release semantics; the peer's wait
// kernel acquires the flag, and its host-to-device copy starts after that kernel completed.
//
// In place: the reduction of chunk c writes output chunk c, which d2h's copy of chunk c reads
// (native wire; a compressed wire's packs all precede the reductions on the caller's stream);
// when input and output overlap, the reduction of chunk c also waits for d2h's chunk-c event.
#include <cstdint>

#include "algo/algo.h"
#include "device/wire.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

__device__ __forceinline__ char* regionOf(const HostArgs& a, int r) {
  return a.base + static_cast<uint64_t>(r) * a.layout.rankBytes;
}

// The epoch an error record names (the other host kernels' numbering of launches).
__device__ __forceinline__ uint32_t callEpoch(const HostArgs& a) {
  return dev::readEpoch(a.state->syncEpoch) + 1;
}

// Launch barrier (one block of 32 threads, on the d2h stream, before its first copy).
__global__ void hostCopyReadyKernel(HostArgs a) {
  const uint32_t launch = a.state->copyLaunches + 1;
  const bool stopped = dev::stopRequested(a.state);
  const uint64_t off = a.layout.flagsOffset + offsetof(HostFlags, copyReady);
  if (threadIdx.x == 0 && !stopped) {
    dev::storeReleaseSys(reinterpret_cast<uint32_t*>(regionOf(a, a.rank) + off), launch);
  }
  (void)dev::hostWaitFlags(a.base, a.layout.rankBytes, off, a.rank, a.nranks, launch, callEpoch(a),
                           a.wait, kWaitHostReady);
}

// Chunk c of the own contribution is in host memory (one block of 32 threads, sig stream).
__global__ void hostCopySignalKernel(HostArgs a, uint32_t c) {
  if (threadIdx.x != 0 || dev::stopRequested(a.state)) return;  // nothing to peers once stopped
  const uint32_t use = a.state->copyUse[c] + 1;
  __threadfence_system();
  const uint64_t off = a.layout.flagsOffset + offsetof(HostFlags, copy) + 4ull * c;
  dev::storeReleaseSys(reinterpret_cast<uint32_t*>(regionOf(a, a.rank) + off), use);
}

// Waits for chunk c of every peer (one block of 32 threads, poll stream). A failed wait has
// been recorded (naming the rank); the launch's later waits then give up at their first check.
__global__ void hostCopyWaitKernel(HostArgs a, uint32_t c) {
  const uint32_t use = a.state->copyUse[c] + 1;
  const uint64_t off = a.layout.flagsOffset + offsetof(HostFlags, copy) + 4ull * c;
  (void)dev::hostWaitFlags(a.base, a.layout.rankBytes, off, a.rank, a.nranks, use, callEpoch(a),
                           a.wait, kWaitHostData);
}

template <typename T, bool kAligned>
__device__ __forceinline__ Vec loadInput(const HostArgs& a, uint64_t v) {
  return dev::loadVecOrZero<T, kAligned>(static_cast<const T*>(a.input), v, a.numVecs, a.count);
}

// Compressed wire: quantizes chunk c of the launch into the send staging (wire.cuh's groups of
// kWireGroupVecs vectors). Index j runs over the chunk's padded vectors, from c x chunkVecs:
// chunks start at multiples of kHostBlockQuantum vectors, so neither a group nor a warp
// straddles chunks, and the padded lanes past the input carry zeros. `end` (first + a multiple
// of 32) is where the chunk's padded vectors end.
template <typename T, bool kAligned, int kWire>
__global__ void __launch_bounds__(kAlgoThreads)
    hostCopyPackKernel(HostCopyArgs a, uint64_t first, uint64_t end) {
  constexpr int E = Elem<T>::kPerVec;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  // Warp-uniform: the chunk's span and the stride are multiples of 32, blocks of whole warps.
  for (uint64_t j = first + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < end;
       j += stride) {
    const uint64_t c = j / a.chunkVecs;
    const uint64_t i = j - c * a.chunkVecs;
    const uint64_t padded = hostCopyPaddedVecs(hostCopyChunkVecs(a.chunkVecs, a.h.numVecs, c));
    char* pay = a.sendStage + c * a.chunkVecs * 16;
    float unused[E];
    dev::wirePut<T, kWire>(loadInput<T, kAligned>(a.h, j), pay, pay + padded * E, i, true, unused);
  }
}

// Reduces chunk c: the n contributions in rank order, fp32. The last chunk's kernel also
// advances the epoch (every block calls finishEpoch) and the launch's counts (block 0; every
// other kernel of the launch, the only readers, has completed before it starts).
template <typename T, bool kAligned, int kWire>
__global__ void __launch_bounds__(kAlgoThreads)
    hostCopyReduceKernel(HostCopyArgs a, uint32_t c, int finish) {
  constexpr int E = Elem<T>::kPerVec;
  const HostArgs& h = a.h;
  const int rank = h.rank;
  const int n = h.nranks;
  const uint64_t V = h.numVecs;
  const uint64_t lo = static_cast<uint64_t>(c) * a.chunkVecs;
  const uint64_t vecs = hostCopyChunkVecs(a.chunkVecs, V, c);
  const uint64_t span = kWire == kWireNative ? vecs : hostCopyPaddedVecs(vecs);
  const uint64_t slotOff = static_cast<uint64_t>(c) * a.chunkVecs * 16;
  auto staged = [&](int s) {  // peer s's chunk c in the receive staging
    const int k = s < rank ? s : s - 1;
    return a.recvStage + static_cast<uint64_t>(k) * h.layout.copyBytes + slotOff;
  };
  T* out = static_cast<T*>(h.output);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < span;
       i += stride) {
    const uint64_t v = lo + i;
    float acc[E] = {};
    if constexpr (kWire == kWireNative) {
      for (int s = 0; s < n; ++s) {
        Vec x;
        if (s == rank) {
          x = loadInput<T, kAligned>(h, v);
        } else {
          x.u = *reinterpret_cast<const uint4*>(staged(s) + i * 16);
        }
        dev::accumulate<T>(acc, x);
      }
    } else {
      // The own contribution as the peers decode it (all 32 lanes take part: group maximum).
      float mine[E];
      dev::wirePut<T, kWire>(loadInput<T, kAligned>(h, v), nullptr, nullptr, i, false, mine);
      for (int s = 0; s < n; ++s) {
        float d[E];
        if (s == rank) {
#pragma unroll
          for (int e = 0; e < E; ++e) d[e] = mine[e];
        } else {
          const char* pay = staged(s);
          dev::wireGet<T, kWire>(pay, pay + span * E, i, d);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] += d[e];
      }
    }
    if (v < V) dev::storeVec<T, kAligned>(out, v, h.count, dev::packVec<T>(acc));
  }
  if (finish) {
    dev::finishEpoch(h.state->syncEpoch, dev::readEpoch(h.state->syncEpoch) + 1);
    if (blockIdx.x == 0) {
      LocalState* st = h.state;
      for (uint32_t k = threadIdx.x; k <= c; k += blockDim.x) st->copyUse[k] += 1;
      if (threadIdx.x == 0) st->copyLaunches += 1;
    }
  }
}

}  // namespace

cudaError_t launchHostCopy(anyrDataType_t dtype, const HostCopyArgs& a, const LaunchShape& shape,
                           const HostCopyStreams& s, cudaStream_t stream) {
  const HostArgs& h = a.h;
  const HostLayout& L = h.layout;
  const uint64_t chunkBytes = a.chunkVecs * 16;
  if (a.chunks == 0 || a.chunks > s.events || a.chunks > static_cast<uint32_t>(kMaxCopyChunks) ||
      chunkBytes == 0 || chunkBytes > L.copyChunkBytes || chunkBytes % (64u << 10) != 0 ||
      static_cast<uint64_t>(a.chunks) * chunkBytes > L.copyBytes) {
    return cudaErrorInvalidValue;
  }
  const uint64_t es = elemBytes(dtype);
  const uint64_t E = 16 / es;
  const uint64_t bytes = h.count * es;
  const char* in = static_cast<const char*>(h.input);
  const char* outBytes = static_cast<const char*>(h.output);
  const bool overlap = in < outBytes + bytes && outBytes < in + bytes;
  const bool native = h.wire == kWireNative;
  char* ownHost = a.hostBase + static_cast<uint64_t>(h.rank) * L.rankBytes + L.copyOffset;

  cudaError_t e = cudaSuccess;
  auto ok = [&](cudaError_t r) {
    if (e == cudaSuccess && r != cudaSuccess) e = r;
    return e == cudaSuccess;
  };
  if (!ok(cudaEventRecord(s.fork, stream))) return e;
  for (cudaStream_t side : {s.d2h, s.sig, s.poll, s.h2d}) {
    if (!ok(cudaStreamWaitEvent(side, s.fork, 0))) return e;
  }
  hostCopyReadyKernel<<<1, 32, 0, s.d2h>>>(h);
  if (!ok(cudaGetLastError())) return e;
  // Compressed wire: quantize the chunks one by one on the caller's stream (local memory speed,
  // while the launch barrier runs), each followed by its event, so chunk 0 leaves after its own
  // quantization rather than the whole launch's, and the d2h stream's later copies find their
  // chunks ready (they still run back to back). The reductions come after every pack in the
  // caller's stream, so no pack waits for an exchange.
  if (!native) {
    for (uint32_t c = 0; c < a.chunks; ++c) {
      const uint64_t first = static_cast<uint64_t>(c) * a.chunkVecs;
      const uint64_t end = first + hostCopyPaddedVecs(hostCopyChunkVecs(a.chunkVecs, h.numVecs, c));
      const LaunchShape pack = spreadShape(end - first, static_cast<uint64_t>(shape.blocks));
      const cudaError_t r = dev::dispatchWire(h.wire, [&](auto wire) {
        return dev::dispatch(dtype, shape.aligned, [&](auto tag) {
          using Tag = decltype(tag);
          constexpr int W = decltype(wire)::value;
          if constexpr (W != kWireNative) {
            hostCopyPackKernel<typename Tag::T, Tag::kAligned, W>
                <<<pack.blocks, pack.threads, 0, stream>>>(a, first, end);
          }
          return cudaGetLastError();
        });
      });
      if (!ok(r) || !ok(cudaEventRecord(s.packed[c], stream))) return e;
    }
  }

  for (uint32_t c = 0; c < a.chunks; ++c) {
    const bool last = c + 1 == a.chunks;
    const uint64_t off = static_cast<uint64_t>(c) * chunkBytes;
    const uint64_t vecs = hostCopyChunkVecs(a.chunkVecs, h.numVecs, c);
    // Bytes of chunk c on the wire: native, the input's own bytes (the last vector may be
    // partial, and the input may end there); compressed, the padded payload and its scales.
    const uint64_t wireBytes =
        native ? (bytes - off < chunkBytes ? bytes - off : chunkBytes) : hostCopyWireBytes(vecs, E);
    // d2h: the own chunk out (copies back to back); sig: its flag once it is out.
    const char* src = native ? in + off : a.sendStage + off;
    if ((!native && !ok(cudaStreamWaitEvent(s.d2h, s.packed[c], 0))) ||
        !ok(cudaMemcpyAsync(ownHost + off, src, wireBytes, cudaMemcpyDeviceToHost, s.d2h)) ||
        !ok(cudaEventRecord(s.copied[c], s.d2h)) ||
        !ok(cudaStreamWaitEvent(s.sig, s.copied[c], 0))) {
      return e;
    }
    hostCopySignalKernel<<<1, 32, 0, s.sig>>>(h, c);
    if (!ok(cudaGetLastError())) return e;

    // poll: wait for every peer's chunk c (runs ahead of the copies); h2d: copy them in.
    hostCopyWaitKernel<<<1, 32, 0, s.poll>>>(h, c);
    if (!ok(cudaGetLastError()) || !ok(cudaEventRecord(s.arrived[c], s.poll)) ||
        !ok(cudaStreamWaitEvent(s.h2d, s.arrived[c], 0))) {
      return e;
    }
    for (int p = 0; p < h.nranks; ++p) {
      if (p == h.rank) continue;
      const int k = p < h.rank ? p : p - 1;
      const char* from = a.hostBase + static_cast<uint64_t>(p) * L.rankBytes + L.copyOffset + off;
      char* to = a.recvStage + static_cast<uint64_t>(k) * L.copyBytes + off;
      if (!ok(cudaMemcpyAsync(to, from, wireBytes, cudaMemcpyHostToDevice, s.h2d))) return e;
    }
    if (!ok(cudaEventRecord(s.recv[c], s.h2d))) return e;

    // The caller's stream: reduce chunk c; the last reduction joins every side stream (sig
    // waited for every copy of d2h, h2d for every wait of poll) and advances the epoch.
    if (overlap && !ok(cudaStreamWaitEvent(stream, s.copied[c], 0))) return e;
    if (last && (!ok(cudaEventRecord(s.signaled, s.sig)) ||
                 !ok(cudaStreamWaitEvent(stream, s.signaled, 0)))) {
      return e;
    }
    if (!ok(cudaStreamWaitEvent(stream, s.recv[c], 0))) return e;
    const cudaError_t r = dev::dispatchWire(h.wire, [&](auto wire) {
      return dev::dispatch(dtype, shape.aligned, [&](auto tag) {
        using Tag = decltype(tag);
        hostCopyReduceKernel<typename Tag::T, Tag::kAligned, decltype(wire)::value>
            <<<shape.blocks, shape.threads, 0, stream>>>(a, c, last ? 1 : 0);
        return cudaGetLastError();
      });
    });
    if (!ok(r)) return e;
  }
  return e;
}

}  // namespace anyr
