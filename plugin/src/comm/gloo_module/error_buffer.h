// Both sides of the Gloo module's C interface report errors by writing a
// message into a caller-provided buffer; this is the one way to do it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

namespace ronde::detail {

// Copies msg into err (at most err_len bytes, always NUL-terminated).
inline void write_error(char* err, size_t err_len, const std::string& msg) {
  if (err == nullptr || err_len == 0) {
    return;
  }
  size_t n = std::min(msg.size(), err_len - 1);
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace ronde::detail
