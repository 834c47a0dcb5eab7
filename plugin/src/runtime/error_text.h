// The message of an exception for embedding in another one: c10::Error's
// what() carries a C++ backtrace that would bury the message.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace ronde::detail {

inline std::string error_text(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    return c->what_without_backtrace();
  }
  return e.what();
}

}  // namespace ronde::detail
