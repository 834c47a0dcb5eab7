// The CPU shares of the ranks of a host (cpu_binding.h).
#include "runtime/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

namespace ronde::detail {

std::vector<int> cpus_for_rank(
    const std::string& mode,
    const std::vector<int>& allowed,
    const std::vector<int>& package,
    int local_rank,
    int local_size,
    std::string& why) {
  why.clear();
  if (mode.empty() || mode == "none")
    return {};
  const int n = static_cast<int>(allowed.size());
  if (mode == "core") {
    if (local_size < 1 || n < local_size) {
      why = std::to_string(local_size) + " ranks on this host, " +
            std::to_string(n) + " CPUs allowed: not binding";
      return {};
    }
    const int share = n / local_size;
    return std::vector<int>(
        allowed.begin() + local_rank * share,
        allowed.begin() + (local_rank + 1) * share);
  }
  if (mode == "socket") {
    std::map<int, std::vector<int>> sockets;
    for (size_t i = 0; i < allowed.size(); ++i)
      sockets[i < package.size() ? package[i] : 0].push_back(allowed[i]);
    if (sockets.empty())
      return {};
    auto it = sockets.begin();
    std::advance(it, local_rank % static_cast<int>(sockets.size()));
    return it->second;
  }
  why = "RONDE_BIND_TO='" + mode + "' is none of core, socket, none";
  return {};
}

std::string bind_process(
    const std::string& mode, int local_rank, int local_size) {
  if (mode.empty() || mode == "none")
    return "";
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0)
    return std::string("cannot read the allowed CPUs: ") + std::strerror(errno);
  std::vector<int> allowed, package;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set))
      continue;
    allowed.push_back(c);
    int id = 0;
    std::ifstream(
        "/sys/devices/system/cpu/cpu" + std::to_string(c) +
        "/topology/physical_package_id") >>
        id;
    package.push_back(id);
  }
  std::string why;
  const std::vector<int> mine =
      cpus_for_rank(mode, allowed, package, local_rank, local_size, why);
  if (mine.empty())
    return why;
  cpu_set_t bound;
  CPU_ZERO(&bound);
  for (int c : mine)
    CPU_SET(c, &bound);
  if (::sched_setaffinity(0, sizeof(bound), &bound) != 0)
    return std::string("cannot bind to CPUs: ") + std::strerror(errno);
  return "";
}

}  // namespace ronde::detail
