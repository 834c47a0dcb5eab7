// Multirank test harness: starts N real processes of a worker program on
// loopback, with the environment ronderun would give them, and collects each
// rank's exit status and output under a timeout. No LibTorch here.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace ronde::testing {

struct RankResult {
  int rank = -1;
  int exit_code = -1;  // valid when signal == 0
  int signal = 0;      // the signal that ended the process, if any
  std::string output;  // stdout and stderr, interleaved
};

struct JobResult {
  std::vector<RankResult> ranks;
  bool timed_out = false;
  double seconds = 0;  // wall time until the last rank ended
  // A readable dump of every rank's output, for assertion messages.
  std::string dump() const;
  bool all_succeeded() const;
};

struct JobSpec {
  std::vector<std::string> argv;  // program and arguments
  int np = 2;
  std::map<std::string, std::string> env;  // added to every rank's env
  std::chrono::seconds timeout{90};
  std::string job_id;  // generated when empty
  int port = 0;        // picked free when 0
  // Ranks to start; empty means all of 0..np-1 (a test can start a partial
  // job, or an impostor rank).
  std::vector<int> only_ranks;
  // When a rank crashes (a signal of crash_signals.h), the
  // others are killed this long after instead of waiting out `timeout`
  // (their peer is gone); zero keeps waiting. Tests that kill a rank on
  // purpose use SIGKILL, which this does not cover.
  std::chrono::seconds crash_grace{0};
};

class RunningJob {
 public:
  explicit RunningJob(JobSpec spec);
  RunningJob(const RunningJob&) = delete;
  RunningJob& operator=(const RunningJob&) = delete;
  ~RunningJob();
  // Waits for every rank (killing all at the timeout) and collects results.
  JobResult wait();
  const JobSpec& spec() const {
    return spec_;
  }
  int pid(int i) const {
    return pids_.at(i);
  }

 private:
  JobSpec spec_;
  std::vector<int> ranks_;
  std::vector<int> pids_;
  std::vector<std::string> logs_;
  std::string dir_;  // the ranks' logs
  std::chrono::steady_clock::time_point start_;
  bool waited_ = false;
};

JobResult run_job(JobSpec spec);

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();
// A fresh, unique job id.
std::string unique_job_id();
// A fresh empty directory under the system temp dir ($TMPDIR or /tmp). It
// and everything in it are removed when the test program exits, unless
// RONDE_TEST_KEEP_DIRS is set (to anything but 0) to look at them after.
std::string make_temp_dir();
// Removes a directory from make_temp_dir() now, with all it holds (kept
// under RONDE_TEST_KEEP_DIRS too).
void remove_temp_dir(const std::string& dir);

// Path of the worker program, from the RONDE_TEST_WORKER definition.
std::string worker_path();

// A job of np ranks running `program` (default: the worker) with `args`.
JobSpec worker_spec(
    std::vector<std::string> args,
    int np,
    const std::string& program = worker_path());

}  // namespace ronde::testing
