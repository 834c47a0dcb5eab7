// The launcher's environment and ronde's own variables
// (runtime/launch_env.h, runtime/settings.h): lines of NAME=value, parsed
// as a rank would. Bad values end in a c10::Error naming the variable.
#include "runtime/launch_env.h"
#include "runtime/settings.h"

#include <c10/util/Exception.h>

#include <map>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> env;
  const std::string text(reinterpret_cast<const char*>(data), size);
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    const std::string line = text.substr(start, nl - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos)
      env[line.substr(0, eq)] = line.substr(eq + 1);
    if (nl == std::string::npos)
      break;
    start = nl + 1;
  }
  ronde::detail::EnvLookup lookup =
      [&env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end())
      return std::nullopt;
    return it->second;
  };
  try {
    (void)ronde::detail::parse_launch_env(lookup);
  } catch (const c10::Error&) {
  }
  try {
    (void)ronde::detail::read_settings(lookup);
  } catch (const c10::Error&) {
  }
  return 0;
}
