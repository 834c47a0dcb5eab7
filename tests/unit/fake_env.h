// An environment for the parsers of launch variables and settings, made of
// a map instead of the process's variables.
#pragma once

#include "runtime/launch_env.h"

#include <map>
#include <optional>
#include <string>

namespace ronde::testing {

// The map is read when the lookup is called: it must outlive the lookup.
inline ronde::detail::EnvLookup fake_env(
    const std::map<std::string, std::string>& vars) {
  return [&vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end())
      return std::nullopt;
    return it->second;
  };
}

}  // namespace ronde::testing
