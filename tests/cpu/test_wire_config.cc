// The opt-in wire format of the host-memory algorithms: configuration field, environment
// variable, validation, and the process-crossing config record.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "base/config.h"
#include "base/error.h"
#include "cpu/expect_error.h"

namespace anyr {
namespace {

struct EnvSet {
  std::string name;
  EnvSet(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvSet() { unsetenv(name.c_str()); }
};

void expectInvalidMentioning(const anyrConfig_t* c, const std::string& what) {
  expectError([&] { resolveConfig(c); }, anyrInvalidArgument, what,
              "expected anyrInvalidArgument mentioning " + what);
}

TEST(WireConfig, NativeByDefault) {
  EXPECT_EQ(resolveConfig(nullptr).wire, anyrWireNative);
  anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
  EXPECT_EQ(resolveConfig(&u).wire, anyrWireNative);
}

TEST(WireConfig, EnvironmentAndFieldExplicitWins) {
  EnvSet e("ANYR_WIRE", "fp8");
  EXPECT_EQ(resolveConfig(nullptr).wire, anyrWireFp8);
  anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
  EXPECT_EQ(resolveConfig(&u).wire, anyrWireFp8);
  u.wire = anyrWireInt8;
  EXPECT_EQ(resolveConfig(&u).wire, anyrWireInt8);
  u.wire = anyrWireNative;
  EXPECT_EQ(resolveConfig(&u).wire, anyrWireNative);
}

TEST(WireConfig, BadValuesNameTheSetting) {
  {
    EnvSet e("ANYR_WIRE", "fp4");
    expectInvalidMentioning(nullptr, "ANYR_WIRE='fp4'");
  }
  anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
  u.wire = 9;
  expectInvalidMentioning(&u, "config.wire");
}

TEST(WireConfig, CrossesProcessesAndCounts) {
  anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
  u.wire = anyrWireInt8;
  Config c = resolveConfig(&u);
  EXPECT_TRUE(Config::fromWire(c.toWire()) == c);
  EXPECT_EQ(Config::fromWire(c.toWire()).wire, anyrWireInt8);
  Config d = c;
  d.wire = anyrWireFp8;
  EXPECT_FALSE(d == c);
  EXPECT_NE(c.describe().find("wire=int8"), std::string::npos) << c.describe();
}

}  // namespace
}  // namespace anyr
