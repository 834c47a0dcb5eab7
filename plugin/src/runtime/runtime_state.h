// The state behind ronde's free functions: what init() found and built. One
// instance per process, created by init() and destroyed by shutdown().
#pragma once

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "runtime/launch_env.h"
#include "runtime/stall_inspector.h"

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>

namespace c10d {
class Store;
}

namespace ronde::detail {

struct Runtime {
  LaunchInfo info;
  std::chrono::milliseconds timeout{30000};
  // Hosted by rank 0; null in a job of one rank.
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<CommWorker> worker;
  // Watches for collectives that a rank never submits; null for one rank.
  std::unique_ptr<StallInspector> inspector;

  // Keys of this job in the store.
  std::string key(const std::string& suffix) const {
    return "ronde/" + info.job_id + "/" + suffix;
  }
};

// The live runtime; throws c10::Error naming the call if init() was not called.
Runtime& runtime(const char* caller);

}  // namespace ronde::detail
