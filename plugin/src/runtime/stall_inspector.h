// The stall inspector: a thread per rank that notices a collective waiting
// for a rank that never submits it. Each rank publishes, about once a
// second, how many collectives it has started and which one, under
// ronde/<job>/progress/<rank> in the job's store. A collective running for
// longer than RONDE_STALL_WARNING_SECONDS (default 60) prints a warning
// naming the ranks that have not reached it and what each did last; after
// RONDE_STALL_SHUTDOWN_SECONDS (default: never) the rank posts a shutdown
// notice in the store and every other rank's inspector closes its
// connections: the waiting collective fails with a CommError, and so does
// the late rank's next collective. (A rank frozen as a whole, inspector
// included, is only caught by the collective timeout.)
// Both need a collective timeout (RONDE_TIMEOUT_SECONDS) longer than
// themselves to ever fire: the timeout ends the wait first otherwise.
#pragma once

#include "runtime/launch_env.h"
#include "runtime/settings.h"

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

namespace c10d {
class Store;
}

namespace ronde::detail {

struct StallOptions {
  double warning_seconds = 60;
  double shutdown_seconds = 0;  // 0: never
};

// From RONDE_STALL_WARNING_SECONDS and RONDE_STALL_SHUTDOWN_SECONDS.
StallOptions stall_options(const Settings& settings);

// What the collectives of this rank have done: the communication worker's
// account, read by the inspector about once a second.
struct WorkProgress {
  int64_t started = 0;  // collectives started so far, this one included
  bool running = false;
  std::string what;  // the running (else the last) collective
  std::chrono::steady_clock::time_point since;  // when it started
};

// What the inspector watches and whom it tells, handed in by init() so that
// the runtime needs no part of comm/.
struct StallWatch {
  std::function<WorkProgress()> progress;
  // Closes this rank's connections from the inspector's thread, so that
  // collectives blocked on them fail now.
  std::function<void()> interrupt;
};

class StallInspector {
 public:
  // Starts the thread. `store` is the job's; `watch`'s functions must stay
  // callable until the inspector is destroyed.
  StallInspector(
      c10::intrusive_ptr<c10d::Store> store,
      LaunchInfo info,
      StallOptions options,
      StallWatch watch);
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

 private:
  void loop();
  // "ranks 1, 3 have not reached it (rank 1 last started #41 allreduce 'x')"
  std::string describe_missing(int64_t started);
  // The value at `key`, or nullopt when the store refused it (a forged or
  // replayed value of an authenticated job): said once per key, never
  // acted upon.
  std::optional<std::string> read_value(const std::string& key);
  // Rank 0: one line when more processes were refused at rendezvous.
  void report_refused();

  c10::intrusive_ptr<c10d::Store> store_;
  const LaunchInfo info_;
  const StallOptions options_;
  const StallWatch watch_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mutex_
  // Only the inspector's thread touches these.
  std::set<std::string> refused_keys_;
  int64_t refused_reported_ = 0;
  std::thread thread_;
};

}  // namespace ronde::detail
