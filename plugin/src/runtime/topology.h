// Where each rank sits, from what the ranks observed rather than from what a
// launcher claimed: ranks with equal host identities (rendezvous.h) share a
// host. No LibTorch here: unit tested on its own.
#pragma once

#include <string>
#include <vector>

namespace ronde::detail {

struct Topology {
  int local_rank = 0;  // this rank's place among its host's ranks
  int local_size = 1;  // ranks on this host
  // Horovod's cross communicator: the ranks with this rank's local rank,
  // one per host, hosts in the order of their lowest rank.
  int cross_rank = 0;
  int cross_size = 1;
  int hosts = 1;  // distinct hosts in the job
  // Every host's ranks, hosts in the order of their lowest rank, ranks
  // ascending.
  std::vector<std::vector<int>> host_ranks;
  // Whether every host runs the same number of ranks.
  bool even() const;
  // The ranks of this rank's host and of its cross communicator.
  std::vector<int> local_ranks(int rank) const;
  std::vector<int> cross_ranks(int rank) const;
};

// `hosts[r]` is rank r's host identity.
Topology derive_topology(const std::vector<std::string>& hosts, int rank);

}  // namespace ronde::detail
