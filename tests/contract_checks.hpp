#pragma once
// The backend contract's promise for bad arguments, checked the same way by every contract test:
// the call throws InvalidArgument, one line that starts with "op: " and names what is broken.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "runtime/error.hpp"

namespace actbench::testing {

// `who` (the backend's name) prefixes every failure message.
inline void expect_refused(const std::string& who, const std::string& op, const std::string& mentions,
                           const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << who << " " << op << " accepted arguments that break \"" << mentions << "\"";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(op + ": ", 0), 0u) << who << ": " << msg;
    EXPECT_NE(msg.find(mentions), std::string::npos) << who << ": \"" << msg << "\" lacks \"" << mentions << "\"";
    EXPECT_EQ(msg.find('\n'), std::string::npos) << who << ": " << msg;
  }
}

}  // namespace actbench::testing
