// anyreduce: the C++ layer over the C API (anyreduce.h). Header-only, C++17.
//
//   anyreduce::UniqueId id = anyreduce::UniqueId::create();      // rank 0; send id.bytes()
//   anyreduce::Communicator comm(nranks, id, rank);              // collective
//   comm.allReduce(send, recv, count, stream);                   // float, __half, __nv_bfloat16
//   comm.allReduceAddRmsNorm(partial, residual, residual, weight, 1e-6f, normed, tokens,
//                            hidden, anyreduce::FusedOptions().weightPlusOne(), stream);
//   comm.destroy();                                              // collective; or the destructor
//
// Every failure throws anyreduce::Error, which carries the anyrResult_t and the library's
// message (the C function's name first, then the argument and the rule it broke, or the rank a
// wait timed out on). The library itself never throws across the C boundary and never exits;
// this layer only turns its result codes into exceptions and its handles into owners.
//
// Ownership: Communicator owns its anyrComm_t and is move-only. anyrCommDestroy is collective
// (every rank's communicator must be destroyed; it meets the peers at a bounded barrier), so
// call destroy() where you want to see its errors; the destructor destroys a communicator still
// open and swallows errors (a destructor cannot throw), and first aborts it when it runs during
// exception unwinding, so that this rank's failure releases the peers' waits instead of leaving
// them to time out (as the Python binding's context manager does).
#ifndef ANYREDUCE_ANYREDUCE_HPP_
#define ANYREDUCE_ANYREDUCE_HPP_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "anyreduce/anyreduce.h"

namespace anyreduce {

// A failed call: code() is the anyrResult_t, what() the library's message.
class Error : public std::runtime_error {
 public:
  Error(anyrResult_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  anyrResult_t code() const noexcept { return code_; }

 private:
  anyrResult_t code_;
};

namespace detail {

// The message of the failure `function` just returned: the library's own (it begins with the
// C function's name), or, when it recorded none for this call, the result's description.
inline std::string failureMessage(anyrResult_t r, const char* function, anyrComm_t comm) {
  const char* recorded = anyrGetLastError(comm);
  const size_t n = std::strlen(function);
  if (recorded != nullptr && std::strncmp(recorded, function, n) == 0) return recorded;
  const char* what = anyrGetErrorString(r);
  return std::string(function) + ": " + (what != nullptr ? what : "unknown result") +
         " (the library recorded no message for this call)";
}

inline void check(anyrResult_t r, const char* function, anyrComm_t comm = nullptr) {
  if (r != anyrSuccess) throw Error(r, failureMessage(r, function, comm));
}

}  // namespace detail

// The anyrDataType_t of an element type: float, __half or __nv_bfloat16.
template <typename T>
struct DataTypeOf {
  static_assert(sizeof(T) == 0, "anyreduce reduces float, __half and __nv_bfloat16 only");
};
template <>
struct DataTypeOf<float> {
  static constexpr anyrDataType_t value = anyrFloat32;
};
template <>
struct DataTypeOf<__half> {
  static constexpr anyrDataType_t value = anyrFloat16;
};
template <>
struct DataTypeOf<__nv_bfloat16> {
  static constexpr anyrDataType_t value = anyrBfloat16;
};
template <typename T>
inline constexpr anyrDataType_t dataTypeOf = DataTypeOf<T>::value;

// ANYR_VERSION_CODE of the loaded library.
inline int version() {
  int v = 0;
  detail::check(anyrGetVersion(&v), "anyrGetVersion");
  return v;
}

// "oneshot-push", "nccl", ...; nullptr for a value that is not an algorithm.
inline const char* algoName(anyrAlgo_t algorithm) { return anyrAlgoName(algorithm); }

inline const char* errorString(anyrResult_t result) { return anyrGetErrorString(result); }

// The 128 bytes every rank needs to join a communicator. create() in the process that will be
// rank 0 (it keeps the listening socket), then hand bytes() to the other ranks.
class UniqueId {
 public:
  UniqueId() { std::memset(&id_, 0, sizeof(id_)); }

  static UniqueId create() {
    UniqueId u;
    detail::check(anyrGetUniqueId(&u.id_), "anyrGetUniqueId");
    return u;
  }

  // From the bytes another process's bytes() gave (exactly ANYR_UNIQUE_ID_BYTES of them).
  static UniqueId fromBytes(const void* data, size_t size) {
    if (data == nullptr || size != sizeof(anyrUniqueId)) {
      throw Error(anyrInvalidArgument,
                  "anyreduce::UniqueId::fromBytes: argument 'size': a unique id is " +
                      std::to_string(sizeof(anyrUniqueId)) + " bytes, got " +
                      (data == nullptr ? std::string("no data") : std::to_string(size)));
    }
    UniqueId u;
    std::memcpy(&u.id_, data, sizeof(u.id_));
    return u;
  }
  static UniqueId fromBytes(const std::string& bytes) {
    return fromBytes(bytes.data(), bytes.size());
  }

  std::string bytes() const { return std::string(id_.internal, sizeof(id_.internal)); }
  const anyrUniqueId& get() const { return id_; }

 private:
  anyrUniqueId id_;
};

// anyrConfig_t with named setters. A field not set takes its environment variable, then the
// library's default (anyreduce.h). The library checks every value at init and names the field.
class Config {
 public:
  Config() : c_(ANYR_CONFIG_INITIALIZER) {}

  Config& algorithm(anyrAlgo_t a) { return set(c_.algorithm, static_cast<int>(a)); }
  Config& timeoutMs(int ms) { return set(c_.timeoutMs, ms); }
  Config& oneShotMaxBytes(size_t b) { return set(c_.oneShotMaxBytes, b); }
  Config& twoShotMaxBytes(size_t b) { return set(c_.twoShotMaxBytes, b); }
  Config& chunkBytes(size_t b) { return set(c_.chunkBytes, b); }
  Config& useNccl(bool on) { return set(c_.useNccl, on ? 1 : 0); }
  Config& maxBlocks(int n) { return set(c_.maxBlocks, n); }
  Config& tuneBudgetMs(int ms) { return set(c_.tuneBudgetMs, ms); }
  Config& wire(anyrWire_t w) { return set(c_.wire, static_cast<int>(w)); }
  Config& fusedCluster(int blocks) { return set(c_.fusedCluster, blocks); }
  Config& peerMemory(anyrPeerMemory_t kind) { return set(c_.peerMemory, static_cast<int>(kind)); }
  // The path is copied: the Config keeps it for as long as it lives.
  Config& tuningFile(const std::string& path) {
    tuningFile_ = path;
    hasTuningFile_ = true;
    return *this;
  }

  // The C struct, valid while this Config lives and is not changed.
  const anyrConfig_t* get() const {
    c_.tuningFile = hasTuningFile_ ? tuningFile_.c_str() : nullptr;
    return &c_;
  }

 private:
  template <typename F, typename V>
  Config& set(F& field, V value) {
    field = static_cast<F>(value);
    return *this;
  }

  mutable anyrConfig_t c_;
  std::string tuningFile_;
  bool hasTuningFile_ = false;
};

// anyrFusedOptions_t with named setters: (1 + weight), and FP8 or NVFP4 output. The pointers
// are device pointers; the library checks them and their rules at each call (anyreduce.h and
// docs/FUSED.md give the layouts).
class FusedOptions {
 public:
  FusedOptions() : o_(ANYR_FUSED_OPTIONS_INITIALIZER) {}

  FusedOptions& weightPlusOne(bool on = true) {
    o_.weightPlusOne = on ? 1 : 0;
    return *this;
  }
  // e4m3 output: q = e4m3(y * (1 / scale[0])), tokens x hidden bytes.
  FusedOptions& fp8(const float* scale, void* quantOut) {
    return quantized(anyrQuantFp8, scale, quantOut, nullptr, nullptr);
  }
  // NVFP4 output with global scale g = globalScale[0]: tokens x hidden/2 bytes of e2m1 pairs,
  // block scales row-major (blockScales) and/or in the swizzled 128x4 layout (swizzled); either
  // may be nullptr, not both.
  FusedOptions& nvfp4(const float* globalScale, void* quantOut, void* blockScales, void* swizzled) {
    return quantized(anyrQuantNvfp4, globalScale, quantOut, blockScales, swizzled);
  }

  const anyrFusedOptions_t* get() const { return &o_; }

 private:
  FusedOptions& quantized(anyrQuant_t mode, const float* scale, void* out, void* blockScales,
                          void* swizzled) {
    o_.quant = mode;
    o_.scale = scale;
    o_.quantOut = out;
    o_.blockScales = blockScales;
    o_.blockScalesSwizzled = swizzled;
    return *this;
  }

  anyrFusedOptions_t o_;
};

// The standalone add + RMSNorm (+ quantization) kernel on an already all-reduced x (no
// communication), on `stream`'s device. Arguments and rules as Communicator::allReduceAddRmsNorm.
template <typename T>
void addRmsNorm(const T* x, const T* residualIn, T* residualOut, const T* weight, float epsilon,
                T* normOut, size_t tokens, size_t hidden, const FusedOptions& options = {},
                cudaStream_t stream = nullptr) {
  detail::check(anyrAddRmsNorm(x, residualIn, residualOut, weight, epsilon, normOut, tokens, hidden,
                               dataTypeOf<T>, options.get(), stream),
                "anyrAddRmsNorm");
}

// One rank's communicator; owns the anyrComm_t. Move-only. Collective calls (construction,
// allReduce, allReduceAddRmsNorm, setAlgorithm, tune, destroy) must be made by every rank in the
// same order with the same sizes (anyreduce.h).
class Communicator {
 public:
  // An empty communicator (as after a move or destroy()): every call on it throws.
  Communicator() = default;

  // anyrCommInitRankConfig: rank `rank` of `nranks`, on the current CUDA device. Collective.
  Communicator(int nranks, const UniqueId& id, int rank, const Config& config = Config()) {
    detail::check(anyrCommInitRankConfig(&comm_, nranks, id.get(), rank, config.get()),
                  "anyrCommInitRank");
  }

  // anyrCommInitFromNccl: over an existing ncclComm_t (which must outlive this communicator).
  static Communicator fromNccl(void* ncclComm, const Config& config = Config()) {
    Communicator c;
    detail::check(anyrCommInitFromNccl(&c.comm_, ncclComm, config.get()), "anyrCommInitFromNccl");
    return c;
  }

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  // Move assignment destroys the communicator this one held (collectively, as the destructor).
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      closeQuietly();
      comm_ = std::exchange(other.comm_, nullptr);
    }
    return *this;
  }
  ~Communicator() { closeQuietly(); }

  // anyrCommDestroy (collective). Afterwards the communicator is empty, also when destroy
  // failed, except with anyrInvalidUsage (another thread is inside a call on it: nothing was
  // freed, and destroy() may be called again once that call returned).
  void destroy() {
    const anyrResult_t r = anyrCommDestroy(handle("anyrCommDestroy"));
    if (r != anyrInvalidUsage) comm_ = nullptr;
    detail::check(r, "anyrCommDestroy");  // destroy records its message for the thread
  }

  // anyrCommAbort: releases every waiting kernel; only destroy() is allowed afterwards.
  void abort() { call(anyrCommAbort(handle("anyrCommAbort")), "anyrCommAbort"); }

  // The communicator's asynchronous error (anyrSuccess, or e.g. a timeout naming a rank),
  // without synchronizing.
  anyrResult_t asyncError() const {
    anyrResult_t e = anyrSuccess;
    call(anyrCommGetAsyncError(handle("anyrCommGetAsyncError"), &e), "anyrCommGetAsyncError");
    return e;
  }
  // Throws the asynchronous error, with the communicator's message, if there is one.
  void throwIfAsyncError() const {
    const anyrResult_t e = asyncError();
    if (e == anyrSuccess) return;
    const char* m = anyrGetLastError(comm_);
    const char* what = anyrGetErrorString(e);
    throw Error(e, m != nullptr && *m != '\0'
                       ? std::string(m)
                       : std::string("asynchronous error: ") + (what != nullptr ? what : "?"));
  }

  int count() const {
    int n = 0;
    call(anyrCommCount(handle("anyrCommCount"), &n), "anyrCommCount");
    return n;
  }
  int rank() const {
    int r = 0;
    call(anyrCommUserRank(handle("anyrCommUserRank"), &r), "anyrCommUserRank");
    return r;
  }
  int device() const {
    int d = 0;
    call(anyrCommCuDevice(handle("anyrCommCuDevice"), &d), "anyrCommCuDevice");
    return d;
  }
  // The ncclComm_t the NCCL path uses (void*), or nullptr when there is none.
  void* ncclComm() const {
    void* n = nullptr;
    call(anyrCommGetNcclComm(handle("anyrCommGetNcclComm"), &n), "anyrCommGetNcclComm");
    return n;
  }

  // Sum all-reduce of `count` elements; send == recv is in place. Asynchronous on `stream`.
  template <typename T>
  void allReduce(const T* send, T* recv, size_t count, cudaStream_t stream = nullptr) {
    allReduce(send, recv, count, dataTypeOf<T>, stream);
  }
  void allReduce(const void* send, void* recv, size_t count, anyrDataType_t datatype,
                 cudaStream_t stream = nullptr) {
    call(anyrAllReduce(send, recv, count, datatype, anyrSum, handle("anyrAllReduce"), stream),
         "anyrAllReduce");
  }

  // Fused all-reduce + residual add + RMSNorm (+ quantization): anyrAllReduceAddRmsNorm. T is
  // __half or __nv_bfloat16; residualIn may be nullptr (no residual), residualOut may be
  // residualIn (in place), normOut may be nullptr with a quantized output.
  template <typename T>
  void allReduceAddRmsNorm(const T* partial, const T* residualIn, T* residualOut, const T* weight,
                           float epsilon, T* normOut, size_t tokens, size_t hidden,
                           const FusedOptions& options = {}, cudaStream_t stream = nullptr) {
    call(anyrAllReduceAddRmsNorm(partial, residualIn, residualOut, weight, epsilon, normOut, tokens,
                                 hidden, dataTypeOf<T>, options.get(),
                                 handle("anyrAllReduceAddRmsNorm"), stream),
         "anyrAllReduceAddRmsNorm");
  }

  // Forces an algorithm for later calls (anyrAlgoAuto restores the choice). Collective.
  void setAlgorithm(anyrAlgo_t algorithm) {
    call(anyrCommSetAlgorithm(handle("anyrCommSetAlgorithm"), algorithm), "anyrCommSetAlgorithm");
  }
  // The algorithm allReduce would use for `count` elements of `datatype`.
  anyrAlgo_t queryAlgorithm(size_t count, anyrDataType_t datatype) const {
    anyrAlgo_t a = anyrAlgoAuto;
    call(anyrCommQueryAlgorithm(handle("anyrCommQueryAlgorithm"), count, datatype, &a),
         "anyrCommQueryAlgorithm");
    return a;
  }
  template <typename T>
  anyrAlgo_t queryAlgorithm(size_t count) const {
    return queryAlgorithm(count, dataTypeOf<T>);
  }

  // anyrCommTune (collective): budgetMs 0 = no limit; savePath may be empty.
  void tune(int budgetMs = 0, const std::string& savePath = std::string()) {
    call(anyrCommTune(handle("anyrCommTune"), budgetMs,
                      savePath.empty() ? nullptr : savePath.c_str()),
         "anyrCommTune");
  }

  // anyrCommExplain: the JSON document (topology, admission with reasons, the choices).
  std::string explain() const {
    anyrComm_t c = handle("anyrCommExplain");
    // The document may grow between the two calls (a tuning table installed by another thread):
    // ask again until it fitted.
    size_t needed = 0;
    call(anyrCommExplain(c, nullptr, 0, &needed), "anyrCommExplain");
    std::string s;
    do {
      s.assign(needed, '\0');
      call(anyrCommExplain(c, s.data(), s.size(), &needed), "anyrCommExplain");
    } while (needed > s.size());
    s.resize(std::strlen(s.c_str()));
    return s;
  }

  anyrCounters_t counters() const {
    anyrCounters_t k{};
    k.size = sizeof(k);
    k.magic = ANYR_COUNTERS_MAGIC;
    call(anyrCommGetCounters(handle("anyrCommGetCounters"), &k), "anyrCommGetCounters");
    return k;
  }
  void resetCounters() {
    call(anyrCommResetCounters(handle("anyrCommResetCounters")), "anyrCommResetCounters");
  }

  // The C handle (still owned here), and whether there is one.
  anyrComm_t get() const noexcept { return comm_; }
  explicit operator bool() const noexcept { return comm_ != nullptr; }
  // Gives up ownership: the caller must anyrCommDestroy the handle.
  anyrComm_t release() noexcept { return std::exchange(comm_, nullptr); }

 private:
  anyrComm_t handle(const char* function) const {
    if (comm_ == nullptr) {
      throw Error(anyrInvalidUsage, std::string(function) +
                                        ": the anyreduce::Communicator is empty (never "
                                        "created, moved from, or destroyed)");
    }
    return comm_;
  }
  void call(anyrResult_t r, const char* function) const { detail::check(r, function, comm_); }

  void closeQuietly() noexcept {
    if (comm_ == nullptr) return;
    // Unwinding past this owner (more exceptions in flight than when it was made): abort first.
    if (std::uncaught_exceptions() > uncaught_) (void)anyrCommAbort(comm_);
    (void)anyrCommDestroy(comm_);
    comm_ = nullptr;
  }

  anyrComm_t comm_ = nullptr;
  int uncaught_ = std::uncaught_exceptions();
};

}  // namespace anyreduce

#endif  // ANYREDUCE_ANYREDUCE_HPP_
