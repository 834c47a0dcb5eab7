// The supervision of a started job: one poll loop forwards the ranks'
// output, reaps them, forwards signals, and takes the whole job down
// (SIGTERM, then SIGKILL after the grace period) as soon as one rank fails,
// so that no rank is left waiting forever; an elastic job's ranks go on
// without it.
#pragma once

#include "growth.h"
#include "output.h"
#include "rank_env.h"
#include "signals.h"
#include "spawn.h"

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ronde::detail {

// Read by ronderun only, not by the ranks.
constexpr const char* kKillGraceVar = "RONDE_KILL_GRACE_SECONDS";
constexpr double kDefaultKillGraceSeconds = 5.0;
constexpr double kMaxKillGraceSeconds = 7.0 * 24 * 3600;

// RONDE_KILL_GRACE_SECONDS' value (null or empty: the default). A value
// that is not a number >= 0 gives the default and sets `warning`.
double parse_kill_grace(const char* text, std::string& warning);

struct SupervisedRank {
  int index = 0;     // its member id: launch rank, or the id it joined with
  std::string host;  // host_key() of where it runs
  pid_t pid = -1;    // also the process group id
  bool running = false;
  std::string prefix;
  OutputStream out;
  OutputStream err;
};

struct SupervisorConfig {
  bool prefix = true;    // tag lines "[rank] "
  bool verbose = false;  // also report ranks that exit cleanly
  double kill_grace_seconds = kDefaultKillGraceSeconds;
  // An elastic job: a failed rank is reported, and the others go on.
  bool elastic = false;
};

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // `sinks` and `signals` outlive the supervisor.
  Supervisor(SupervisorConfig config, Sinks& sinks, SignalForwarding& signals)
      : config_(config), sinks_(sinks), signals_(signals) {}

  // Starts every rank in order, stopping early on a signal or a failure.
  // A launch without argv runs `command` here; a rank on another host
  // gets `secret` on its stdin.
  void start(
      const std::vector<RankLaunch>& launches,
      const std::vector<std::string>& command,
      const std::string& secret,
      const ChildSetup& setup);

  // An elastic job that grows (call before watch()): `launch` makes the
  // launch of a process joining on `host` as member `member`.
  void enable_growth(
      GrowthConfig config,
      std::function<RankLaunch(const std::string& host, int member)> launch);

  // Returns once every rank has exited and its output is closed.
  void watch();

  // The first failing rank's code, else 128 + the signal that stopped the
  // job, else 0. An elastic job succeeds when a rank finished cleanly
  // and no signal stopped it: the ranks that failed were left behind.
  int exit_code() const;

 private:
  bool finished() const;
  bool any_running() const;
  int poll_timeout_ms() const;
  bool poll_once();
  void handle_deadlines();
  void kill_at_deadline();
  void drop_lingering_output();
  void handle_pending_signals();
  void reap_children();
  void on_rank_exit(SupervisedRank& rank, int status);
  bool read_stream(SupervisedRank& rank, OutputStream& stream);
  void close_stream(SupervisedRank& rank, OutputStream& stream);
  void emit_lines(
      const SupervisedRank& rank, int sink, const char* data, size_t size);
  void stop_ranks(int signo, double seconds_until_kill);
  bool spawn(SupervisedRank& rank, const RankLaunch& launch);
  // Elastic growth, between polls: replacements that are due, and the
  // discovery script's new slots.
  void handle_growth();
  void schedule_restart(const SupervisedRank& rank);
  void signal_live_groups(int signo);
  void abort_job();

  SupervisorConfig config_;
  Sinks& sinks_;
  SignalForwarding& signals_;
  std::vector<SupervisedRank> ranks_;
  bool stopping_ = false;
  bool killed_ = false;
  int interrupted_by_ = 0;
  std::optional<int> first_failure_code_;
  bool any_clean_exit_ = false;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
  // What start() was given, for processes started later.
  std::vector<std::string> command_;
  std::string secret_;
  ChildSetup setup_;
  // Elastic growth.
  GrowthConfig growth_;
  std::function<RankLaunch(const std::string&, int)> joiner_launch_;
  struct Restart {
    std::string host;
    Clock::time_point due;
  };
  std::vector<Restart> restarts_;
  std::map<std::string, int> host_failures_;
  std::set<std::string> blacklist_;
  std::optional<Clock::time_point> next_discovery_;
  std::string last_discovery_error_;
  int next_member_ = 0;
};

}  // namespace ronde::detail
