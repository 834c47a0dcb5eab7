// The job as comm/ sees it: the communicator, the worker that runs
// collectives on it, and what a failed collective needs to name its
// suspects. init() builds it and installs it; shutdown() takes it down. comm/
// never reaches into the runtime: what it needs from there is handed in here.
#pragma once

#include "comm/comm_worker.h"
#include "comm/communicator.h"

#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

namespace ronde::detail {

struct World {
  int rank = 0;
  int size = 1;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<CommWorker> worker;  // runs on `comm`: destroyed first
  // After a collective failed here: the peers that did not report the
  // failure themselves in time (the runtime's failure notices in the
  // store). Null in a job of one rank: nobody to blame.
  std::function<std::vector<int>()> failed_peers;
  // The fingerprints of calls whose descriptors every rank checked in full
  // (comm/jobs.cpp). Touched only by the running job, one at a time; every
  // rank adds the same ones in the same order, so the sets stay equal.
  std::unordered_set<uint64_t> verified_calls;

  ~World();
};

// The live World; throws c10::Error naming `caller` before init().
World& world(const char* caller);
// init() installs the World it built; shutdown() removes it and returns it,
// to be destroyed after the barrier.
void install_world(std::unique_ptr<World> w);
std::unique_ptr<World> remove_world();

}  // namespace ronde::detail
