// Compiles the installed C++ layer (anyreduce/anyreduce.hpp) and checks two calls that need no
// GPU: the version, and an init error turned into anyreduce::Error with the library's message.
#include <anyreduce/anyreduce.hpp>
#include <cstdio>
#include <string>

int main() {
  if (anyreduce::version() != ANYR_VERSION_CODE) return 1;
  try {
    anyreduce::Communicator comm(0, anyreduce::UniqueId(), 0);
  } catch (const anyreduce::Error& e) {
    std::printf("anyreduce C++ layer installed; nranks 0 -> %s\n", e.what());
    const bool named = std::string(e.what()).find("'nranks'") != std::string::npos;
    return e.code() == anyrInvalidArgument && named ? 0 : 2;
  }
  return 3;
}
