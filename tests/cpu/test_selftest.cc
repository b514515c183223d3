// Host-side pieces of the startup self-test: the fault-injection switch's parser, the registry
// entries, and the exactness of the checksum pattern in every dtype.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include "algo/selftest_kernels.h"
#include "base/env.h"
#include "base/error.h"
#include "core/selftest.h"

namespace anyr {
namespace {

TEST(SelfTest, ParsesTheFaultInjectionSwitch) {
  EXPECT_EQ(parseFaultInjection("").kind, FaultInjection::None);
  FaultInjection f = parseFaultInjection("corrupt-peer:1");
  EXPECT_EQ(f.kind, FaultInjection::CorruptPeer);
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(parseFaultInjection("corrupt-peer:7").rank, 7);
  f = parseFaultInjection("ipc-open:0");
  EXPECT_EQ(f.kind, FaultInjection::IpcOpenFails);
  EXPECT_EQ(f.rank, 0);
  EXPECT_EQ(parseFaultInjection("ipc-open:5").rank, 5);
  f = parseFaultInjection("vmm-granularity:1");
  EXPECT_EQ(f.kind, FaultInjection::VmmGranularity);
  EXPECT_EQ(f.rank, 1);
  f = parseFaultInjection("host-copy-selftest:1");
  EXPECT_EQ(f.kind, FaultInjection::HostCopySelfTest);
  EXPECT_EQ(f.rank, 1);
  f = parseFaultInjection("fabric-fail:3");
  EXPECT_EQ(f.kind, FaultInjection::FabricFails);
  EXPECT_EQ(f.rank, 3);
  f = parseFaultInjection("fabric-slow-writes:1");
  EXPECT_EQ(f.kind, FaultInjection::FabricSlowWrites);
  EXPECT_EQ(f.rank, 1);
  for (const char* bad : {"corrupt-peer:",
                          "corrupt-peer:x",
                          "corrupt-peer:-1",
                          "corrupt-peer:8",
                          "corrupt-peer:1x",
                          "corrupt",
                          "1",
                          "ipc-open:",
                          "ipc-open:8",
                          "ipc-open:-2",
                          "ipc-open:1 ",
                          "ipc-open",
                          "vmm-granularity:",
                          "vmm-granularity",
                          "vmm-granularity:9",
                          "host-copy-selftest:",
                          "host-copy-selftest:8",
                          "host-copy-selftest",
                          "fabric-fail:",
                          "fabric-fail:8",
                          "fabric-fail",
                          "fabric-slow-writes:-1",
                          "fabric-slow-writes"}) {
    try {
      parseFaultInjection(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), anyrInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("ANYR_FAULT_INJECT"), std::string::npos) << e.what();
    }
  }
}

TEST(SelfTest, SwitchesAreDeclaredInTheRegistry) {
  EXPECT_EQ(env::getString("ANYR_SELFTEST"), "1");
  EXPECT_FALSE(env::isSet("ANYR_FAULT_INJECT"));
}

TEST(SelfTest, ChecksumPatternIsExactInEveryDtypeUpTo8Ranks) {
  for (int n = 2; n <= 8; ++n) {
    for (uint64_t i = 0; i < 14; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < n; ++r) {
        const float v = selfTestValue(r, i);
        EXPECT_EQ(__bfloat162float(__float2bfloat16_rn(v)), v);  // inputs exact in bf16
        sum += v;
      }
      EXPECT_EQ(sum, selfTestExpected(n, i));
      EXPECT_EQ(__bfloat162float(__float2bfloat16_rn(sum)), sum) << "n=" << n << " i=" << i;
      EXPECT_LE(sum, 256.0f);
    }
  }
}

}  // namespace
}  // namespace anyr
