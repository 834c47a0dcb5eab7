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

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace ronde::detail {

struct Runtime;

struct StallOptions {
  double warning_seconds = 60;
  double shutdown_seconds = 0;  // 0: never
};

// From RONDE_STALL_WARNING_SECONDS and RONDE_STALL_SHUTDOWN_SECONDS.
StallOptions stall_options_from_env();

class StallInspector {
 public:
  // Starts the thread; `rt` must outlive the inspector.
  StallInspector(Runtime& rt, StallOptions options);
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

 private:
  void loop();
  // "ranks 1, 3 have not reached it (rank 1 last started #41 allreduce 'x')"
  std::string describe_missing(int64_t started);

  Runtime& rt_;
  StallOptions options_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace ronde::detail
