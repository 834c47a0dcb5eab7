// Topology from host identities.
#include "runtime/topology.h"

#include <map>
#include <stdexcept>

namespace ronde::detail {

bool Topology::even() const {
  for (const auto& h : host_ranks) {
    if (h.size() != host_ranks.front().size())
      return false;
  }
  return true;
}

std::vector<int> Topology::local_ranks(int rank) const {
  for (const auto& h : host_ranks) {
    for (int r : h) {
      if (r == rank)
        return h;
    }
  }
  throw std::out_of_range("rank " + std::to_string(rank) + " is on no host");
}

std::vector<int> Topology::cross_ranks(int rank) const {
  size_t position = 0;
  for (const auto& h : host_ranks) {
    for (size_t i = 0; i < h.size(); ++i) {
      if (h[i] == rank)
        position = i;
    }
  }
  std::vector<int> out;
  for (const auto& h : host_ranks) {
    if (position < h.size())
      out.push_back(h[position]);
  }
  return out;
}

Topology derive_topology(const std::vector<std::string>& hosts, int rank) {
  Topology t;
  if (hosts.empty()) {
    t.host_ranks = {{rank}};
    return t;
  }
  std::map<std::string, size_t> index;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    auto [it, fresh] = index.emplace(hosts[r], t.host_ranks.size());
    if (fresh)
      t.host_ranks.emplace_back();
    t.host_ranks[it->second].push_back(r);
  }
  t.hosts = static_cast<int>(t.host_ranks.size());
  const std::vector<int> local = t.local_ranks(rank);
  t.local_size = static_cast<int>(local.size());
  for (int i = 0; i < t.local_size; ++i) {
    if (local[i] == rank)
      t.local_rank = i;
  }
  const std::vector<int> cross = t.cross_ranks(rank);
  t.cross_size = static_cast<int>(cross.size());
  for (int i = 0; i < t.cross_size; ++i) {
    if (cross[i] == rank)
      t.cross_rank = i;
  }
  return t;
}

}  // namespace ronde::detail
