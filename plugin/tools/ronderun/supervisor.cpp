// The supervision loop (see supervisor.h): start, watch, stop, exit codes.
#include "supervisor.h"

#include "exit_status.h"
#include "fd_util.h"
#include "options.h"
#include "runtime/posix_io.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace ronde::detail {
namespace {

constexpr double kSignalKillSeconds = 10.0;
// How long output pipes may stay open once every rank has exited: only a
// background process left behind by a rank keeps them open that long.
constexpr double kDrainSeconds = 3.0;
// Bounds the reads done when a rank exits, so a background process that
// keeps writing cannot hold the supervisor in one place.
constexpr int kMaxDrainReads = 64;
constexpr size_t kReadChunk = 64 * 1024;

Supervisor::Clock::duration seconds_to_duration(double seconds) {
  return std::chrono::duration_cast<Supervisor::Clock::duration>(
      std::chrono::duration<double>(seconds));
}

// 1, 0.5, 2.25: a duration as a person writes it.
std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

}  // namespace

double parse_kill_grace(const char* text, std::string& warning) {
  if (text == nullptr || *text == '\0') {
    return kDefaultKillGraceSeconds;
  }
  char* end = nullptr;
  errno = 0;
  const double value = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(value) ||
      value < 0) {
    warning =
        std::string("ignoring ") + kKillGraceVar + "='" + text + "'; using " +
        std::to_string(static_cast<int>(kDefaultKillGraceSeconds)) + " seconds";
    return kDefaultKillGraceSeconds;
  }
  return std::min(value, kMaxKillGraceSeconds);
}

void Supervisor::start(
    const std::vector<RankLaunch>& launches,
    const std::vector<std::string>& command,
    const std::string& secret,
    const ChildSetup& setup) {
  command_ = command;
  secret_ = secret;
  setup_ = setup;
  next_member_ = static_cast<int>(launches.size());
  ranks_.resize(launches.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ranks_[r].index = static_cast<int>(r);
    ranks_[r].host = host_key(launches[r].host);
    ranks_[r].prefix = rank_prefix(static_cast<int>(r));
    ranks_[r].out.sink = STDOUT_FILENO;
    ranks_[r].err.sink = STDERR_FILENO;
  }
  for (SupervisedRank& rank : ranks_) {
    // Starting more ranks would only give the poll loop more to stop.
    if (SignalForwarding::any_pending()) {
      break;
    }
    if (!spawn(rank, launches[static_cast<size_t>(rank.index)])) {
      first_failure_code_ = kFailureExitCode;
      stop_ranks(SIGTERM, config_.kill_grace_seconds);
      break;
    }
  }
}

bool Supervisor::spawn(SupervisedRank& rank, const RankLaunch& launch) {
  const bool remote = !launch.argv.empty();
  SpawnedRank spawned;
  if (!spawn_rank(
          rank.index,
          remote ? launch.argv : command_,
          launch.env,
          remote ? secret_ : std::string(),
          setup_,
          sinks_,
          spawned)) {
    return false;
  }
  rank.pid = spawned.pid;
  rank.running = true;
  rank.out.fd = spawned.out_fd;
  rank.err.fd = spawned.err_fd;
  return true;
}

void Supervisor::enable_growth(
    GrowthConfig config,
    std::function<RankLaunch(const std::string& host, int member)> launch) {
  growth_ = std::move(config);
  joiner_launch_ = std::move(launch);
  if (!growth_.discovery_script.empty()) {
    next_discovery_ = Clock::now();
  }
}

void Supervisor::schedule_restart(const SupervisedRank& rank) {
  const std::string where = rank.host.empty() ? "this host" : rank.host;
  const int failures = ++host_failures_[rank.host];
  if (failures >= growth_.max_failures_per_host) {
    blacklist_.insert(rank.host);
    sinks_.message(
        where + " has had " + std::to_string(failures) +
        " failed ranks: no more ranks are started there");
    return;
  }
  restarts_.push_back(
      {rank.host,
       Clock::now() + seconds_to_duration(growth_.cooldown_seconds)});
  sinks_.message(
      "starting a replacement for rank " + std::to_string(rank.index) + " on " +
      where + " in " + seconds_text(growth_.cooldown_seconds) + " s");
}

void Supervisor::handle_growth() {
  // Training is over once a rank finished cleanly; with nobody left,
  // nobody could admit a new rank.
  if (stopping_ || any_clean_exit_ || !any_running() || !joiner_launch_) {
    restarts_.clear();
    next_discovery_.reset();
    return;
  }
  const auto now = Clock::now();
  std::vector<std::string> hosts;
  for (auto it = restarts_.begin(); it != restarts_.end();) {
    if (it->due <= now) {
      hosts.push_back(it->host);
      it = restarts_.erase(it);
    } else {
      ++it;
    }
  }
  if (next_discovery_ && *next_discovery_ <= now) {
    next_discovery_ =
        now + seconds_to_duration(growth_.discovery_interval_seconds);
    std::string output;
    std::vector<HostSlots> found;
    std::string error = run_discovery(growth_.discovery_script, output);
    if (error.empty()) {
      error = parse_discovery(output, found);
    }
    if (!error.empty() && error != last_discovery_error_) {
      sinks_.message(error);
    }
    last_discovery_error_ = error;
    if (error.empty()) {
      std::map<std::string, int> running;
      for (const SupervisedRank& r : ranks_) {
        if (r.running) {
          ++running[r.host];
        }
      }
      for (const Restart& r : restarts_) {
        ++running[r.host];
      }
      for (const std::string& h : hosts) {
        ++running[host_key(h)];
      }
      const int most = growth_.max_ranks;
      for (const std::string& h :
           plan_growth(found, running, most, blacklist_)) {
        hosts.push_back(h);
      }
    }
  }
  for (const std::string& host : hosts) {
    const int member = next_member_++;
    ranks_.emplace_back();
    SupervisedRank& rank = ranks_.back();
    rank.index = member;
    rank.host = host_key(host);
    rank.prefix = rank_prefix(member);
    rank.out.sink = STDOUT_FILENO;
    rank.err.sink = STDERR_FILENO;
    sinks_.message(
        "starting rank " + std::to_string(member) + " on " +
        (rank.host.empty() ? std::string("this host") : rank.host) +
        " to join the running job");
    if (!spawn(rank, joiner_launch_(host, member))) {
      rank.running = false;
    }
  }
}

int Supervisor::exit_code() const {
  if (config_.elastic && any_clean_exit_ && interrupted_by_ == 0) {
    return 0;
  }
  if (first_failure_code_) {
    return *first_failure_code_;
  }
  return interrupted_by_ != 0 ? 128 + interrupted_by_ : 0;
}

bool Supervisor::any_running() const {
  return std::any_of(
      ranks_.begin(), ranks_.end(), [](const SupervisedRank& rank) {
        return rank.running;
      });
}

bool Supervisor::finished() const {
  return restarts_.empty() &&
         std::all_of(
             ranks_.begin(), ranks_.end(), [](const SupervisedRank& rank) {
               return !rank.running && rank.out.fd < 0 && rank.err.fd < 0;
             });
}

int Supervisor::poll_timeout_ms() const {
  std::optional<Clock::time_point> next;
  std::vector<std::optional<Clock::time_point>> deadlines = {
      kill_deadline_, drain_deadline_, next_discovery_};
  for (const Restart& r : restarts_) {
    deadlines.emplace_back(r.due);
  }
  for (const auto& deadline : deadlines) {
    if (deadline && (!next || *deadline < *next)) {
      next = deadline;
    }
  }
  if (!next) {
    return -1;
  }
  const auto left = *next - Clock::now();
  if (left <= Clock::duration::zero()) {
    return 0;
  }
  // Rounded up so that we never wake just before the deadline and spin.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, 24LL * 3600 * 1000));
}

void Supervisor::signal_live_groups(int signo) {
  for (SupervisedRank& rank : ranks_) {
    const bool live = rank.running || rank.out.fd >= 0 || rank.err.fd >= 0;
    if (rank.pid <= 0 || !live) {
      continue;
    }
    if (kill(-rank.pid, signo) < 0 && errno == ESRCH && rank.running) {
      // The rank moved itself to another group; still reach the rank.
      (void)kill(rank.pid, signo);
    }
  }
}

void Supervisor::stop_ranks(int signo, double seconds_until_kill) {
  stopping_ = true;
  signal_live_groups(signo);
  if (killed_) {
    return;
  }
  const auto deadline = Clock::now() + seconds_to_duration(seconds_until_kill);
  if (!kill_deadline_ || deadline < *kill_deadline_) {
    kill_deadline_ = deadline;
  }
}

void Supervisor::handle_deadlines() {
  if (growth_.any()) {
    handle_growth();
  }
  const auto now = Clock::now();
  if (kill_deadline_ && now >= *kill_deadline_) {
    kill_at_deadline();
  }
  if (!any_running() && !finished() && !drain_deadline_) {
    drain_deadline_ = now + seconds_to_duration(kDrainSeconds);
  }
  if (drain_deadline_ && now >= *drain_deadline_) {
    drop_lingering_output();
  }
}

void Supervisor::kill_at_deadline() {
  kill_deadline_.reset();
  killed_ = true;
  if (any_running()) {
    sinks_.message("ranks still running after the grace period; killing them");
  }
  signal_live_groups(SIGKILL);
}

void Supervisor::drop_lingering_output() {
  drain_deadline_.reset();
  for (SupervisedRank& rank : ranks_) {
    if (rank.out.fd < 0 && rank.err.fd < 0) {
      continue;
    }
    sinks_.message(
        "rank " + std::to_string(rank.index) +
        " exited but left processes that hold its output open; no longer "
        "forwarding it");
    // The job is being torn down anyway, so nothing may outlive it.
    if (stopping_ && rank.pid > 0) {
      (void)kill(-rank.pid, SIGKILL);
    }
    close_stream(rank, rank.out);
    close_stream(rank, rank.err);
  }
}

void Supervisor::handle_pending_signals() {
  for (int signo : SignalForwarding::take_pending()) {
    if (interrupted_by_ == 0) {
      interrupted_by_ = signo;
    }
    sinks_.message(
        "got " + signal_name(signo) + "; forwarding it to the ranks");
    stop_ranks(signo, kSignalKillSeconds);
  }
}

void Supervisor::reap_children() {
  while (true) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) {
      continue;
    }
    if (pid <= 0) {
      return;
    }
    for (SupervisedRank& rank : ranks_) {
      if (rank.pid == pid && rank.running) {
        on_rank_exit(rank, status);
        break;
      }
    }
  }
}

void Supervisor::on_rank_exit(SupervisedRank& rank, int status) {
  rank.running = false;
  // Forward what the rank wrote before it died ahead of our verdict on it,
  // so its last error message reads before "rank R exited".
  for (OutputStream* stream : {&rank.out, &rank.err}) {
    for (int i = 0; i < kMaxDrainReads && stream->fd >= 0; ++i) {
      if (!read_stream(rank, *stream)) {
        break;
      }
    }
  }
  const RankExit exit = rank_exit(status);
  const std::string who = "rank " + std::to_string(rank.index) + " ";
  if (exit.code == 0) {
    any_clean_exit_ = true;
  }
  if (config_.elastic && exit.code != 0 && !stopping_) {
    if (!first_failure_code_) {
      first_failure_code_ = exit.code;
    }
    sinks_.message(
        who + exit.how +
        (any_running() ? "; the job is elastic: the other ranks go on" : ""));
    if (growth_.restart_failed && !any_clean_exit_ && any_running()) {
      schedule_restart(rank);
    }
    return;
  }
  if (exit.code == 0 || first_failure_code_) {
    if (config_.verbose) {
      sinks_.message(who + exit.how);
    }
    return;
  }
  first_failure_code_ = exit.code;
  // After a forwarded signal the ranks are already shutting down; a SIGTERM
  // on top would cut short their handling of the user's signal.
  if (stopping_) {
    sinks_.message(who + exit.how);
    return;
  }
  sinks_.message(
      who + exit.how + (any_running() ? "; stopping the other ranks" : ""));
  // Also reaches processes this rank left behind holding its output open.
  stop_ranks(SIGTERM, config_.kill_grace_seconds);
}

// Reads one chunk; returns true when data arrived and more may follow.
bool Supervisor::read_stream(SupervisedRank& rank, OutputStream& stream) {
  char buffer[kReadChunk];
  const ssize_t n = read(stream.fd, buffer, sizeof(buffer));
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
      return errno == EINTR;
    }
    sinks_.message(
        "rank " + std::to_string(rank.index) +
        ": reading output failed: " + errno_text());
    close_stream(rank, stream);
    return false;
  }
  if (n == 0) {
    close_stream(rank, stream);
    return false;
  }
  const size_t end =
      append_and_find_lines(stream.pending, buffer, static_cast<size_t>(n));
  if (end > 0) {
    emit_lines(rank, stream.sink, stream.pending.data(), end);
    stream.pending.erase(0, end);
  }
  return true;
}

void Supervisor::close_stream(SupervisedRank& rank, OutputStream& stream) {
  if (stream.fd < 0) {
    return;
  }
  close_fd(stream.fd);
  if (!stream.pending.empty()) {
    stream.pending += '\n';
    emit_lines(rank, stream.sink, stream.pending.data(), stream.pending.size());
    stream.pending.clear();
    stream.pending.shrink_to_fit();
  }
}

void Supervisor::emit_lines(
    const SupervisedRank& rank, int sink, const char* data, size_t size) {
  if (!config_.prefix) {
    sinks_.write(sink, data, size);
    return;
  }
  const std::string text = tag_lines(rank.prefix, data, size);
  sinks_.write(sink, text.data(), text.size());
}

// Used only when poll itself fails: nothing can be supervised any more, so
// the job is killed outright and every child reaped before we exit.
void Supervisor::abort_job() {
  sinks_.message("giving up on the job; killing all ranks");
  signal_live_groups(SIGKILL);
  for (SupervisedRank& rank : ranks_) {
    while (rank.running) {
      int status = 0;
      const pid_t pid = waitpid(rank.pid, &status, 0);
      if (pid < 0 && errno == EINTR) {
        continue;
      }
      rank.running = false;
    }
    close_fd(rank.out.fd);
    close_fd(rank.err.fd);
  }
  if (!first_failure_code_) {
    first_failure_code_ = kFailureExitCode;
  }
}

// One round of the loop: wait for output, a signal or a deadline, then
// handle what came. False when poll failed and the job was aborted.
bool Supervisor::poll_once() {
  std::vector<struct pollfd> fds = {{signals_.wake_fd(), POLLIN, 0}};
  std::vector<std::pair<SupervisedRank*, OutputStream*>> streams = {
      {nullptr, nullptr}};
  for (SupervisedRank& rank : ranks_) {
    for (OutputStream* stream : {&rank.out, &rank.err}) {
      if (stream->fd >= 0) {
        fds.push_back({stream->fd, POLLIN, 0});
        streams.emplace_back(&rank, stream);
      }
    }
  }
  const int ready = poll(fds.data(), fds.size(), poll_timeout_ms());
  if (ready < 0 && errno != EINTR) {
    sinks_.message("poll failed: " + errno_text());
    abort_job();
    return false;
  }
  if (ready > 0 && fds[0].revents != 0) {
    signals_.drain_wake_pipe();
  }
  handle_pending_signals();
  // Reaping before reading lets on_rank_exit drain a dead rank's output
  // in order; a SIGCHLD lost to coalescing is covered by reaping always.
  reap_children();
  for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
    OutputStream* stream = streams[i].second;
    if (fds[i].revents == 0 || stream->fd != fds[i].fd) {
      continue;
    }
    if (fds[i].revents & POLLNVAL) {
      close_stream(*streams[i].first, *stream);
      continue;
    }
    (void)read_stream(*streams[i].first, *stream);
  }
  return true;
}

void Supervisor::watch() {
  while (true) {
    handle_deadlines();
    if (finished() || !poll_once()) {
      return;
    }
  }
}

}  // namespace ronde::detail
