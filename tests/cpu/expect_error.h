// The CPU tests' check of a refusal: a call that must throw anyreduce's Error with a given code
// and a message that says a given thing.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "anyreduce/anyreduce.h"
#include "base/error.h"

namespace anyr {

// `call` must throw an Error with `code` whose message contains `part`; where it returns, the
// failure says `accepted`.
inline void expectError(const std::function<void()>& call, anyrResult_t code,
                        const std::string& part, const std::string& accepted) {
  try {
    call();
    ADD_FAILURE() << accepted;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// The same, the message containing every one of `parts`.
inline void expectError(const std::function<void()>& call, anyrResult_t code,
                        std::initializer_list<std::string> parts, const std::string& accepted) {
  try {
    call();
    ADD_FAILURE() << accepted;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
}

}  // namespace anyr
