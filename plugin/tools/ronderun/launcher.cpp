// One job from start to end (see launcher.h); each step is its own unit.
#include "launcher.h"

#include "hosts.h"
#include "job_setup.h"
#include "output.h"
#include "rank_env.h"
#include "runtime/launch_contract.h"
#include "runtime/posix_io.h"
#include "secret.h"
#include "signals.h"
#include "supervisor.h"
#include "timeline_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace ronde::detail {
namespace {

class Job {
 public:
  explicit Job(Options options) : options_(std::move(options)) {}

  int run();

 private:
  bool prepare();
  bool fail(const std::string& error);
  bool open_dev_null();
  bool any_remote_host() const;
  JobContext context() const;
  void report_start();

  Options options_;
  Sinks sinks_;
  SignalForwarding signals_;
  JobSecret secret_;
  int dev_null_fd_ = -1;
  double kill_grace_seconds_ = kDefaultKillGraceSeconds;
};

// Prints `error` when there is one; true when there was none.
bool Job::fail(const std::string& error) {
  if (!error.empty()) {
    sinks_.message(error);
  }
  return error.empty();
}

bool Job::open_dev_null() {
  do {
    dev_null_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  } while (dev_null_fd_ < 0 && errno == EINTR);
  return fail(dev_null_fd_ < 0 ? "cannot open /dev/null: " + errno_text() : "");
}

bool Job::any_remote_host() const {
  for (const HostSlots& h : options_.hosts) {
    if (!is_local_host(h.host)) {
      return true;
    }
  }
  return false;
}

bool Job::prepare() {
  if (!ensure_std_fds_open() || !fail(signals_.install()) || !open_dev_null()) {
    return false;
  }
  if (options_.port == 0 && !fail(pick_free_port(options_))) {
    return false;
  }
  if (!fail(choose_rendezvous_address(options_))) {
    return false;
  }
  if (options_.job_id.empty()) {
    options_.job_id = make_job_id();
  }
  std::string warning;
  kill_grace_seconds_ = parse_kill_grace(getenv(kKillGraceVar), warning);
  fail(warning);
  if (!options_.timeline_dir.empty() &&
      !fail(prepare_timeline_dir(options_.timeline_dir, options_.num_ranks))) {
    return false;
  }
  return fail(secret_.prepare(
      getenv(kJobSecretFileVar), any_remote_host(), getenv("TMPDIR")));
}

JobContext Job::context() const {
  JobContext job;
  job.secret_file = secret_.file();
  job.secret_on_stdin = !secret_.bytes().empty();
  char cwd[4096] = {0};
  if (getcwd(cwd, sizeof(cwd) - 1) != nullptr) {
    job.cwd = cwd;
  }
  return job;
}

void Job::report_start() {
  std::string command;
  for (const std::string& arg : options_.command) {
    command += (command.empty() ? "" : " ") + shell_quote(arg);
  }
  std::string hosts;
  for (const HostSlots& h : options_.hosts) {
    hosts +=
        (hosts.empty() ? " on " : ",") + h.host + ":" + std::to_string(h.slots);
  }
  sinks_.message(
      "job id " + options_.job_id + ", rendezvous " + options_.host + ":" +
      std::to_string(options_.port) + ", " +
      std::to_string(options_.num_ranks) + " rank(s)" + hosts + ": " +
      command);
}

int Job::run() {
  const pid_t parent_pid = getpid();
  if (!prepare()) {
    return kFailureExitCode;
  }
  const std::vector<RankLaunch> launches =
      rank_launches(options_, process_environment(), context());
  if (options_.verbose) {
    report_start();
  }
  SupervisorConfig config;
  config.prefix = options_.prefix;
  config.verbose = options_.verbose;
  config.kill_grace_seconds = kill_grace_seconds_;
  Supervisor supervisor(config, sinks_, signals_);
  supervisor.start(
      launches,
      options_.command,
      secret_.bytes(),
      ChildSetup{&signals_, parent_pid, dev_null_fd_});
  supervisor.watch();
  secret_.remove();
  if (!options_.timeline_dir.empty()) {
    sinks_.message(
        merge_job_timeline(options_.timeline_dir, options_.num_ranks));
  }
  return supervisor.exit_code();
}

}  // namespace

int run_job(Options options) {
  Job job(std::move(options));
  return job.run();
}

}  // namespace ronde::detail
