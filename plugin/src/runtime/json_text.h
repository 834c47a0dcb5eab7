// JSON string escaping shared by the metrics and timeline writers.
#pragma once

#include <cstdio>
#include <string>

namespace ronde::detail {

// `s` as the inside of a JSON string literal (quotes, backslashes and
// control characters escaped).
inline std::string json_escape(const std::string& s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      r += buf;
    } else {
      r += c;
    }
  }
  return r;
}

}  // namespace ronde::detail
