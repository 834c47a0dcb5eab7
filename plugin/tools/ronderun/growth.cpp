// Discovery output, the script's run, and the growth plan.
#include "growth.h"

#include "runtime/posix_io.h"

#include <sys/wait.h>

#include <cstdio>
#include <sstream>

namespace ronde::detail {

std::string host_key(const std::string& host) {
  return host.empty() || is_local_host(host) ? std::string() : host;
}

std::string parse_discovery(
    const std::string& output, std::vector<HostSlots>& hosts) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) {
      line.resize(hash);
    }
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) {
      continue;
    }
    const size_t last = line.find_last_not_of(" \t\r");
    std::string error = parse_host_list(
        line.substr(first, last - first + 1), "--host-discovery-script", hosts);
    if (!error.empty()) {
      return error;
    }
  }
  return "";
}

std::string run_discovery(const std::string& script, std::string& output) {
  output.clear();
  FILE* pipe = popen(script.c_str(), "r");
  if (pipe == nullptr) {
    return "cannot run the host discovery script: " + errno_text();
  }
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    output.append(buffer, n);
  }
  const int status = pclose(pipe);
  if (status != 0) {
    return "the host discovery script '" + script + "' failed (status " +
           std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status) +
           ")";
  }
  return "";
}

std::vector<std::string> plan_growth(
    const std::vector<HostSlots>& discovered,
    const std::map<std::string, int>& running,
    int max_ranks,
    const std::set<std::string>& blacklist) {
  int total = 0;
  for (const auto& [host, count] : running) {
    (void)host;
    total += count;
  }
  std::map<std::string, int> placed = running;
  std::vector<std::string> out;
  for (const HostSlots& h : discovered) {
    const std::string key = host_key(h.host);
    if (blacklist.count(key)) {
      continue;
    }
    while (total < max_ranks && placed[key] < h.slots) {
      ++placed[key];
      ++total;
      out.push_back(h.host);
    }
  }
  return out;
}

}  // namespace ronde::detail
