// The C++ layer (include/anyreduce/anyreduce.hpp) where no GPU is needed: errors carry the
// result code and the library's message, unique ids round-trip through their bytes, the Config
// and FusedOptions setters reach the C structs, an empty or moved-from Communicator refuses
// every call by name, and the calls that fail before any CUDA work (argument rules, config
// rules) throw the library's own message.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "anyreduce/anyreduce.hpp"

namespace {

// Runs `f`, which must throw anyreduce::Error with `code`; returns its message.
template <typename F>
std::string errorOf(F&& f, anyrResult_t code) {
  try {
    f();
  } catch (const anyreduce::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no anyreduce::Error thrown";
  return "";
}

TEST(CppLayer, VersionNamesAndDataTypes) {
  EXPECT_EQ(anyreduce::version(), ANYR_VERSION_CODE);
  EXPECT_STREQ(anyreduce::algoName(anyrAlgoNccl), "nccl");
  EXPECT_STREQ(anyreduce::algoName(anyrAlgoOneShotPush), "oneshot-push");
  EXPECT_EQ(anyreduce::algoName(static_cast<anyrAlgo_t>(99)), nullptr);
  EXPECT_NE(anyreduce::errorString(anyrTimeout), nullptr);
  static_assert(anyreduce::dataTypeOf<float> == anyrFloat32);
  static_assert(anyreduce::dataTypeOf<__half> == anyrFloat16);
  static_assert(anyreduce::dataTypeOf<__nv_bfloat16> == anyrBfloat16);
  static_assert(std::is_base_of_v<std::runtime_error, anyreduce::Error>);
}

TEST(CppLayer, UniqueIdRoundTripsThroughItsBytes) {
  const anyreduce::UniqueId id = anyreduce::UniqueId::create();
  const std::string bytes = id.bytes();
  ASSERT_EQ(bytes.size(), static_cast<size_t>(ANYR_UNIQUE_ID_BYTES));
  EXPECT_NE(bytes, std::string(ANYR_UNIQUE_ID_BYTES, '\0'));
  const anyreduce::UniqueId back = anyreduce::UniqueId::fromBytes(bytes);
  EXPECT_EQ(back.bytes(), bytes);
  EXPECT_EQ(std::memcmp(&back.get(), &id.get(), sizeof(anyrUniqueId)), 0);
  // Two ids differ (their secrets are random).
  EXPECT_NE(anyreduce::UniqueId::create().bytes(), bytes);
  const std::string m = errorOf([] { anyreduce::UniqueId::fromBytes("abc"); }, anyrInvalidArgument);
  EXPECT_NE(m.find("argument 'size': a unique id is 128 bytes, got 3"), std::string::npos) << m;
  const std::string m2 =
      errorOf([] { anyreduce::UniqueId::fromBytes(nullptr, 128); }, anyrInvalidArgument);
  EXPECT_NE(m2.find("got no data"), std::string::npos) << m2;
}

TEST(CppLayer, InitErrorsCarryTheLibrarysMessage) {
  const std::string m =
      errorOf([] { anyreduce::Communicator c(0, anyreduce::UniqueId(), 0); }, anyrInvalidArgument);
  EXPECT_EQ(m.rfind("anyrCommInitRank", 0), 0u) << m;
  EXPECT_NE(m.find("argument 'nranks': world size 0 out of range 1..1024"), std::string::npos) << m;
  const std::string r =
      errorOf([] { anyreduce::Communicator c(2, anyreduce::UniqueId(), 5); }, anyrInvalidArgument);
  EXPECT_NE(r.find("argument 'rank': rank 5 out of range 0..1"), std::string::npos) << r;
  // A config value outside its rule is refused at init, before any rendezvous, naming the field.
  const std::string t = errorOf(
      [] {
        anyreduce::Communicator c(1, anyreduce::UniqueId(), 0, anyreduce::Config().timeoutMs(-5));
      },
      anyrInvalidArgument);
  EXPECT_NE(t.find("config.timeoutMs"), std::string::npos) << t;
  EXPECT_NE(t.find("got -5"), std::string::npos) << t;
}

TEST(CppLayer, ConfigSettersReachTheCStruct) {
  // Field by field (the structs have padding bytes).
  const anyrConfig_t init = ANYR_CONFIG_INITIALIZER;
  const anyreduce::Config plain;
  const anyrConfig_t* p = plain.get();
  EXPECT_EQ(p->size, init.size);
  EXPECT_EQ(p->magic, init.magic);
  EXPECT_EQ(p->version, init.version);
  EXPECT_EQ(p->algorithm, init.algorithm);
  EXPECT_EQ(p->timeoutMs, init.timeoutMs);
  EXPECT_EQ(p->oneShotMaxBytes, init.oneShotMaxBytes);
  EXPECT_EQ(p->twoShotMaxBytes, init.twoShotMaxBytes);
  EXPECT_EQ(p->chunkBytes, init.chunkBytes);
  EXPECT_EQ(p->useNccl, init.useNccl);
  EXPECT_EQ(p->maxBlocks, init.maxBlocks);
  EXPECT_EQ(p->tuningFile, nullptr);
  EXPECT_EQ(p->tuneBudgetMs, init.tuneBudgetMs);
  EXPECT_EQ(p->wire, init.wire);
  EXPECT_EQ(p->fusedCluster, init.fusedCluster);
  EXPECT_EQ(p->peerMemory, init.peerMemory);
  anyreduce::Config c;
  c.algorithm(anyrAlgoTwoShotPush)
      .timeoutMs(1234)
      .oneShotMaxBytes(1 << 16)
      .twoShotMaxBytes(1 << 24)
      .chunkBytes(1 << 20)
      .useNccl(false)
      .maxBlocks(64)
      .tuneBudgetMs(500)
      .wire(anyrWireFp8)
      .fusedCluster(2)
      .peerMemory(anyrPeerMemoryVmm)
      .tuningFile("/tmp/table.json");
  const anyrConfig_t* k = c.get();
  EXPECT_EQ(k->size, sizeof(anyrConfig_t));
  EXPECT_EQ(k->magic, ANYR_CONFIG_MAGIC);
  EXPECT_EQ(k->algorithm, anyrAlgoTwoShotPush);
  EXPECT_EQ(k->timeoutMs, 1234);
  EXPECT_EQ(k->oneShotMaxBytes, size_t{1} << 16);
  EXPECT_EQ(k->twoShotMaxBytes, size_t{1} << 24);
  EXPECT_EQ(k->chunkBytes, size_t{1} << 20);
  EXPECT_EQ(k->useNccl, 0);
  EXPECT_EQ(k->maxBlocks, 64);
  EXPECT_EQ(k->tuneBudgetMs, 500);
  EXPECT_EQ(k->wire, anyrWireFp8);
  EXPECT_EQ(k->fusedCluster, 2);
  EXPECT_EQ(k->peerMemory, anyrPeerMemoryVmm);
  ASSERT_NE(k->tuningFile, nullptr);
  EXPECT_STREQ(k->tuningFile, "/tmp/table.json");
  // A copy points at its own copy of the path, so it outlives the original.
  anyreduce::Config copy = c;
  c = anyreduce::Config();
  EXPECT_EQ(c.get()->tuningFile, nullptr);
  EXPECT_STREQ(copy.get()->tuningFile, "/tmp/table.json");
}

TEST(CppLayer, FusedOptionsSettersReachTheCStruct) {
  const anyreduce::FusedOptions plain;
  EXPECT_EQ(plain.get()->size, sizeof(anyrFusedOptions_t));
  EXPECT_EQ(plain.get()->magic, ANYR_FUSED_MAGIC);
  EXPECT_EQ(plain.get()->weightPlusOne, 0);
  EXPECT_EQ(plain.get()->quant, anyrQuantNone);
  EXPECT_EQ(plain.get()->scale, nullptr);
  EXPECT_EQ(plain.get()->quantOut, nullptr);
  EXPECT_EQ(plain.get()->blockScales, nullptr);
  EXPECT_EQ(plain.get()->blockScalesSwizzled, nullptr);
  float scale = 1.0f;
  char q[16], s[16], sw[16];
  anyreduce::FusedOptions o;
  o.weightPlusOne().fp8(&scale, q);
  EXPECT_EQ(o.get()->weightPlusOne, 1);
  EXPECT_EQ(o.get()->quant, anyrQuantFp8);
  EXPECT_EQ(o.get()->scale, &scale);
  EXPECT_EQ(o.get()->quantOut, q);
  o.nvfp4(&scale, q, s, sw).weightPlusOne(false);
  EXPECT_EQ(o.get()->weightPlusOne, 0);
  EXPECT_EQ(o.get()->quant, anyrQuantNvfp4);
  EXPECT_EQ(o.get()->blockScales, s);
  EXPECT_EQ(o.get()->blockScalesSwizzled, sw);
  o.fp8(&scale, q);  // back to FP8: the NVFP4 scale pointers are cleared
  EXPECT_EQ(o.get()->blockScales, nullptr);
  EXPECT_EQ(o.get()->blockScalesSwizzled, nullptr);
}

TEST(CppLayer, AnEmptyCommunicatorRefusesEveryCallByName) {
  anyreduce::Communicator c;
  EXPECT_FALSE(c);
  EXPECT_EQ(c.get(), nullptr);
  float x = 0;
  const std::string m = errorOf([&] { c.allReduce(&x, &x, 1); }, anyrInvalidUsage);
  EXPECT_EQ(m,
            "anyrAllReduce: the anyreduce::Communicator is empty (never created, moved from, "
            "or destroyed)");
  errorOf([&] { c.destroy(); }, anyrInvalidUsage);
  errorOf([&] { c.abort(); }, anyrInvalidUsage);
  errorOf([&] { (void)c.rank(); }, anyrInvalidUsage);
  errorOf([&] { (void)c.explain(); }, anyrInvalidUsage);
  errorOf([&] { (void)c.queryAlgorithm<__nv_bfloat16>(1024); }, anyrInvalidUsage);
  const std::string f = errorOf(
      [&] {
        c.allReduceAddRmsNorm<__half>(nullptr, nullptr, nullptr, nullptr, 1e-6f, nullptr, 1, 128);
      },
      anyrInvalidUsage);
  EXPECT_EQ(f.rfind("anyrAllReduceAddRmsNorm: ", 0), 0u) << f;
  anyreduce::Communicator moved = std::move(c);
  EXPECT_FALSE(moved);
  EXPECT_EQ(moved.release(), nullptr);
}

TEST(CppLayer, StandaloneKernelArgumentRulesThrowTheLibrarysMessage) {
  // Rules on values come before any CUDA work, so they hold without a GPU.
  const std::string h = errorOf(
      [] {
        anyreduce::addRmsNorm<__nv_bfloat16>(nullptr, nullptr, nullptr, nullptr, 1e-6f, nullptr, 1,
                                             100);
      },
      anyrInvalidArgument);
  EXPECT_EQ(h.rfind("anyrAddRmsNorm", 0), 0u) << h;
  EXPECT_NE(h.find("argument 'hidden'"), std::string::npos) << h;
  const std::string e = errorOf(
      [] {
        anyreduce::addRmsNorm<__half>(nullptr, nullptr, nullptr, nullptr, 0.0f, nullptr, 1, 128);
      },
      anyrInvalidArgument);
  EXPECT_NE(e.find("argument 'epsilon'"), std::string::npos) << e;
  const std::string x = errorOf(
      [] {
        anyreduce::addRmsNorm<__half>(nullptr, nullptr, nullptr, nullptr, 1e-6f, nullptr, 1, 128);
      },
      anyrInvalidArgument);
  EXPECT_NE(x.find("argument 'x': must not be NULL"), std::string::npos) << x;
  // Zero tokens is a no-op: nothing is read, written or launched.
  EXPECT_NO_THROW(anyreduce::addRmsNorm<__nv_bfloat16>(nullptr, nullptr, nullptr, nullptr, 1e-6f,
                                                       nullptr, 0, 4096));
}

TEST(CppLayer, AMessageLeftFromAnotherCallIsNotReused) {
  // The last recorded failure is anyrCommInitRank's; a failure of another function that
  // recorded nothing gets the result's description instead of that stale message.
  errorOf([] { anyreduce::Communicator c(0, anyreduce::UniqueId(), 0); }, anyrInvalidArgument);
  const std::string m =
      anyreduce::detail::failureMessage(anyrInternalError, "anyrCommTune", nullptr);
  EXPECT_EQ(m.rfind("anyrCommTune: ", 0), 0u) << m;
  EXPECT_NE(m.find("the library recorded no message for this call"), std::string::npos) << m;
  EXPECT_EQ(m.find("nranks"), std::string::npos) << m;
}

}  // namespace
