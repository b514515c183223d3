// The standalone residual add + RMSNorm (+ FP8 / NVFP4) kernel: what an unfused pipeline runs
// after its all-reduce, and the epilogue of anyreduce's NCCL path. launchAddRmsNormWith picks a
// form (fused/fused.h, AddRmsNormForm) and launches it; the Rows forms live in
// fused/add_rmsnorm_rows.cuh, the Cluster form in fused/add_rmsnorm_cluster.cu. This file holds
// the two first kernels:
//  - the staged kernel (Staged): one block per row, the row staged in shared memory as fp32 (so
//    x may be normOut: the whole row is read before anything is written), then
//    fusedRowEpilogue (fused/epilogue.cuh), so the bits equal those of the fused all-reduce
//    kernels. Block size: the caller's, a multiple of 32 in 32..1024. Shared memory:
//    fusedSharedBytes(hidden), at most 69,648 bytes (hidden 16384); the kernel's dynamic shared
//    memory limit is raised once per device (launchWithSmem).
//  - the first register kernel (Regs): one block of fusedThreads(hidden) threads per row, the
//    row in registers (every width, up to four vectors a thread at hidden 16384), the general
//    code: the quantization mode and each buffer's alignment read at run time.
#include "algo/algo.h"
#include "device/launch.cuh"
#include "fused/add_rmsnorm.h"
#include "fused/epilogue.cuh"
#include "fused/fused.h"
#include "fused/fused_algo.h"
#include "fused/kernel_attrs.h"
#include "fused/launch.cuh"

namespace anyr {

// Dynamic shared memory of this file's kernels, at most (scripts/check-smem.py reads the line):
// anyr-dynamic-smem-max: 69648
static_assert(fusedSharedBytes(kFusedMaxHidden) == 69648, "update anyr-dynamic-smem-max");
namespace {

constexpr int kMaxThreads = 1024;
// The register kernel takes every width: four vectors a thread of kAlgoThreads at most.
static_assert(4 * kAlgoThreads == rowVecs(kFusedMaxHidden),
              "the register kernel takes every width");

// (kMaxThreads, 1): one block of 1024 may use 64 registers a thread; without the 1, ptxas for
// sm_80 aimed at two such blocks (32 registers) and spilled.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 1) addRmsNormKernel(const T* x, FusedParams p) {
  extern __shared__ float4 fusedSmem[];
  float* xs = reinterpret_cast<float*>(fusedSmem);
  float* red = xs + p.hidden;
  dev::waitForPrevious();
  const int hidden = p.hidden;
  const int nvec = rowVecs(hidden);
  const bool aligned = dev::isAligned(x, 16);
  for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    const T* xr = x + static_cast<int64_t>(row) * hidden;
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      const dev::Vec xv = dev::loadRowVec(xr, v, hidden, aligned);
      float f[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = dev::vecElem<T>(xv, i);
      dev::storeXs8(xs, v, f);
    }
    __syncthreads();
    dev::fusedRowEpilogue<T>(p, row, xs, red);
  }
}

// The register-resident kernel: fusedThreads(hidden) threads, VPT (1 to 4) vectors each, the
// register epilogue's block rule. x may be normOut: a block loads its whole row before it
// writes any of it. Up to two vectors a thread (hidden 8192) (kAlgoThreads, 2): two blocks per
// SM, 64 registers a thread; three or four (hidden 16384) (kAlgoThreads, 1), so the row's
// three loads still stay in registers.
template <typename T, int VPT>
__global__ void __launch_bounds__(kAlgoThreads, VPT <= 2 ? 2 : 1)
    addRmsNormRegsKernel(const T* x, FusedParams p) {
  __shared__ float red[kFusedRedFloats];
  dev::waitForPrevious();
  const int hidden = p.hidden;
  const bool xAligned = dev::isAligned(x, 16);
  const bool resAligned = dev::isAligned(p.residualIn, 16);
  dev::Vec w[VPT];
  dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.weight), 0, hidden, dev::isAligned(p.weight, 16),
                           w);
  const float qscale = dev::quantScale(p);
  for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    if (row != static_cast<int>(blockIdx.x)) __syncthreads();  // the last row has read red
    dev::Vec xv[VPT];
    dev::Vec res[VPT] = {};
    dev::loadRowRegs<T, VPT>(x, row, hidden, xAligned, xv);
    if (p.residualIn != nullptr) {
      dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), row, hidden, resAligned, res);
    }
    float acc[VPT][8];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[k][i] = dev::vecElem<T>(xv[k], i);
    }
    const dev::RowOutputs<T> o(p, row, qscale);
    dev::fusedRowEpilogueRegs<T, VPT>(p, o, acc, res, w, red, true);
  }
}

template <typename T>
cudaError_t launchTyped(const void* x, const FusedParams& p, cudaStream_t stream, int threads,
                        bool pdl) {
  const int blocks = p.tokens < kAddRmsNormMaxGrid ? p.tokens : kAddRmsNormMaxGrid;
  return launchWithSmem(addRmsNormKernel<T>, blocks, threads, fusedSharedBytes(p.hidden),
                        fusedSharedBytes(kFusedMaxHidden), stream, pdl, static_cast<const T*>(x),
                        p);
}

template <typename T>
cudaError_t launchRegs(const void* x, const FusedParams& p, cudaStream_t stream, bool pdl) {
  const int blocks = p.tokens < kAddRmsNormMaxGrid ? p.tokens : kAddRmsNormMaxGrid;
  const int threads = fusedThreads(p.hidden);
  const T* xt = static_cast<const T*>(x);
  // 1 to 4 at every width (the static_assert above); any other count takes the widest kernel.
  const int vpt = rowVecsPerThread(p.hidden, threads);
  constexpr int kMaxVpt = dev::kFusedRegsMaxVpt;
  return dev::dispatchCount<kMaxVpt>(vpt >= 1 && vpt < kMaxVpt ? vpt : kMaxVpt, [&](auto v) {
    return launchKernel(addRmsNormRegsKernel<T, decltype(v)::value>, dim3(blocks), dim3(threads), 0,
                        stream, pdl, xt, p);
  });
}

__global__ void e2m1InstructionKernel(int* out) { *out = ANYR_E2M1_CVT; }

}  // namespace

cudaError_t launchE2m1InstructionProbe(int* word, cudaStream_t stream) {
  const cudaError_t err = cudaMemsetAsync(word, 0xff, sizeof(int), stream);
  if (err != cudaSuccess) return err;
  e2m1InstructionKernel<<<1, 1, 0, stream>>>(word);
  return cudaGetLastError();
}

const char* addRmsNormFormName(AddRmsNormForm form) {
  switch (form) {
    case AddRmsNormForm::Auto:
      return "auto";
    case AddRmsNormForm::Staged:
      return "staged";
    case AddRmsNormForm::Regs:
      return "regs";
    case AddRmsNormForm::Rows:
      return "rows";
    case AddRmsNormForm::Cluster:
      return "cluster";
  }
  return nullptr;
}

cudaError_t launchAddRmsNormWith(anyrDataType_t datatype, const void* x, const FusedParams& p,
                                 cudaStream_t stream, const AddRmsNormLaunch& l,
                                 AddRmsNormShape* shapeOut) {
  AddRmsNormShape local;
  AddRmsNormShape& shape = shapeOut != nullptr ? *shapeOut : local;
  shape = AddRmsNormShape{};
  if (p.tokens == 0) return cudaSuccess;
  if (p.hidden > kFusedMaxHidden) return cudaErrorInvalidValue;
  if (l.form == AddRmsNormForm::Staged) {
    if (l.threads % 32 != 0 || l.threads < 32 || l.threads > kMaxThreads) {
      return cudaErrorInvalidValue;
    }
    shape.form = AddRmsNormForm::Staged;
    shape.blocks = p.tokens < kAddRmsNormMaxGrid ? p.tokens : kAddRmsNormMaxGrid;
    shape.threads = l.threads;
    shape.smem = fusedSharedBytes(p.hidden);
    return dev::dispatchDtype<true>(datatype, [&](auto tag) {
      return launchTyped<typename decltype(tag)::T>(x, p, stream, l.threads, l.pdl);
    });
  }
  if (l.form == AddRmsNormForm::Regs) {
    shape.form = AddRmsNormForm::Regs;
    shape.blocks = p.tokens < kAddRmsNormMaxGrid ? p.tokens : kAddRmsNormMaxGrid;
    shape.threads = fusedThreads(p.hidden);
    shape.vpt = rowVecsPerThread(p.hidden, shape.threads);
    return dev::dispatchDtype<true>(datatype, [&](auto tag) {
      return launchRegs<typename decltype(tag)::T>(x, p, stream, l.pdl);
    });
  }
  if (l.maxVpt < 0 || l.maxVpt > dev::kFusedRegsMaxVpt) return cudaErrorInvalidValue;
  const int c0 = l.clusterBlocks;
  if (c0 != 0 && c0 != 2 && c0 != 4 && c0 != 8) return cudaErrorInvalidValue;
  AddRmsNormTarget target;
  DeviceFacts facts;
  cudaError_t e = currentDeviceFacts(&facts);
  if (e != cudaSuccess) return e;
  const bool clusters = facts.clusters;
  target.device = facts.device;
  target.sms = facts.sms;
  target.pdl = l.pdl;
  target.release = l.release;
  target.clusterExitBarrier = l.clusterExitBarrier;
  target.grid = l.grid;
  // The kernel's dtypes (bf16, fp16) are two bytes an element.
  target.cacheHints = l.hints == AddRmsNormHints::On ||
                      (l.hints == AddRmsNormHints::Auto &&
                       addRmsNormHintsAt(addRmsNormBytes(x, p, 2), facts.l2Bytes));
  AddRmsNormForm form = l.form;
  if (form == AddRmsNormForm::Auto) {
    form = addRmsNormAutoForm(p.hidden, p.tokens, target.sms, clusters && l.clusters);
  }
  if (form == AddRmsNormForm::Cluster) {
    int c = c0;
    if (c == 0) {
      c = addRmsNormClusterBlocks(p.hidden, p.tokens, target.sms);
      if (c < 2) c = 2;
    }
    if (clusters && fusedClusterFits(p.hidden)) {
      shape.form = AddRmsNormForm::Cluster;
      shape.clusterBlocks = c;
      e = launchAddRmsNormCluster(datatype, x, p, stream, target, &shape);
      if (e == cudaSuccess) return e;
      // A device whose attribute promises clusters but refuses this launch (MIG, MPS or a
      // driver that cannot place it: an error returned before anything was queued) runs the
      // Rows form instead; an error left by earlier work is not cleared here, and the Rows
      // launch returns it.
      (void)cudaGetLastError();
    }
    form = AddRmsNormForm::Rows;
  }
  shape = AddRmsNormShape{};
  const int maxVpt =
      l.maxVpt != 0 ? l.maxVpt
                    : addRmsNormRowsVpt(p.tokens, target.sms, p.hidden, p.quant != anyrQuantNone);
  shape.threads = addRmsNormRowThreads(p.hidden, maxVpt);
  shape.vpt = rowVecsPerThread(p.hidden, shape.threads);
  shape.form = AddRmsNormForm::Rows;
  return launchAddRmsNormRows(datatype, x, p, stream, target, &shape);
}

cudaError_t launchAddRmsNorm(anyrDataType_t datatype, const void* x, const FusedParams& p,
                             cudaStream_t stream, int threads, bool pdl) {
  AddRmsNormLaunch l;
  if (threads != 0) {
    l.form = AddRmsNormForm::Staged;
    l.threads = threads;
  }
  l.pdl = pdl;
  return launchAddRmsNormWith(datatype, x, p, stream, l);
}

}  // namespace anyr
