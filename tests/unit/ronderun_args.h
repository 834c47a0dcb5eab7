// What the ronderun unit tests share: parse_args on a command line written
// as a list of words.
#pragma once

#include "options.h"

#include <initializer_list>
#include <string>
#include <vector>

namespace ronde::detail {

// parse_args on "ronderun ARGS...": returns the error ("" when valid).
inline std::string parse(
    std::initializer_list<const char*> args, Options& options) {
  std::vector<std::string> words = {"ronderun"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) {
    argv.push_back(&w[0]);
  }
  return parse_args(static_cast<int>(argv.size()), argv.data(), options);
}

}  // namespace ronde::detail
