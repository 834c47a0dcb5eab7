// Scenarios of ranks that fail: a peer killed mid-collective, on the job
// or on a process set (the others must report it, within the timeout), an
// init() that must fail cleanly, and a rank that aborts at once.
#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/process_set.h>
#include <ronde/runtime.h>

#include "scenario_registry.h"
#include "worker_checks.h"

#include <ATen/ATen.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <thread>
#include <vector>

namespace {

// This process dies of SIGKILL 30 ms from now, in whatever it is doing.
void kill_self_soon() {
  std::thread killer([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ::kill(::getpid(), SIGKILL);
  });
  killer.detach();
}

// The last rank dies (SIGKILL) while a large all-reduce is in flight; the
// others must fail with a CommError naming the operation, within the timeout.
RONDE_SCENARIO(kill_peer) {
  ronde::init();
  const int me = ronde::rank(), n = ronde::size();
  ronde::barrier();
  at::Tensor big = at::ones({32 << 20});  // 128 MiB: long enough to be mid-way
  if (me == n - 1)
    kill_self_soon();
  try {
    for (int i = 0; i < 50; ++i) {
      ronde::allreduce_(big, ronde::AllreduceOptions().name("big"));
    }
    std::cout << "NO_ERROR" << std::endl;
    return 1;
  } catch (const ronde::CommError& e) {
    ronde::testing::print_comm_error(e);
    // Later calls fail at once, without hanging.
    try {
      ronde::allreduce(at::ones({1}));
      std::cout << "LATER_CALL_SUCCEEDED" << std::endl;
      return 1;
    } catch (const ronde::CommError& later) {
      std::cout << "LATER: " << later.what() << std::endl;
    }
    ronde::shutdown();
    return 3;
  }
}

// A member of a process set dies mid-collective: the other member fails
// with a CommError naming the set, its suspects taken among the set's
// ranks; the rank outside the set learns of it at its next job collective.
RONDE_SCENARIO(kill_in_set) {
  ronde::init();
  const int me = ronde::rank(), n = ronde::size();
  std::vector<int> members;
  for (int r = 1; r < n; ++r)
    members.push_back(r);
  ronde::ProcessSet set = ronde::add_process_set(members);
  ronde::barrier();
  if (me == n - 1)
    kill_self_soon();
  try {
    if (set.included()) {
      at::Tensor big = at::ones({32 << 20});
      for (int i = 0; i < 50; ++i) {
        ronde::allreduce_(
            big, ronde::AllreduceOptions().name("in_set").process_set(set));
      }
    } else {
      for (int i = 0; i < 50; ++i)
        ronde::barrier();
    }
    std::cout << "NO_ERROR" << std::endl;
    return 1;
  } catch (const ronde::CommError& e) {
    ronde::testing::print_comm_error(e);
    // Rank 0 hosts the store: it stays while the members look for each
    // other's failure notices there.
    if (!set.included())
      std::this_thread::sleep_for(std::chrono::seconds(4));
    ronde::shutdown();
    return 3;
  }
}

// Expects init() to fail cleanly (not crash); prints the message.
RONDE_SCENARIO(init_error) {
  try {
    ronde::init();
    ronde::allreduce(at::ones({4}));
    std::cout << "INIT_SUCCEEDED" << std::endl;
    ronde::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cout << "INIT_ERROR: " << e.what() << std::endl;
    return 5;
  }
}

// Rank 1 aborts at once, as an uncaught exception would; the others sleep
// for a minute and exit 0 unless the harness stops them first
// (JobSpec::crash_grace).
RONDE_SCENARIO(crash) {
  const char* rank_env = std::getenv("RONDE_RANK");
  if (rank_env != nullptr && std::atoi(rank_env) == 1)
    std::abort();
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

}  // namespace
