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
#include "store_host.h"
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
  bool start_store_host();
  bool any_remote_host() const;
  JobContext context() const;
  void report_start();

  Options options_;
  Sinks sinks_;
  SignalForwarding signals_;
  JobSecret secret_;
  StoreHost store_host_;  // an elastic job's store
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

// An elastic job's store lives here, not in rank 0, so that it outlives
// every rank.
bool Job::start_store_host() {
  char self[4096] = {0};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string program =
      n > 0 ? find_store_program(std::string(self, static_cast<size_t>(n)))
            : std::string();
  if (program.empty()) {
    return fail(
        "--min-np needs ronde_store, the store host, beside ronderun (or in "
        "the ronde package of its environment), and it is not there");
  }
  return fail(store_host_.start(program, options_.port, 30000));
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
      std::to_string(options_.num_ranks) + " rank(s)" + hosts + ": " + command);
}

int Job::run() {
  const pid_t parent_pid = getpid();
  if (!prepare()) {
    return kFailureExitCode;
  }
  if (options_.min_ranks > 0 && !start_store_host()) {
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
  config.elastic = options_.min_ranks > 0;
  Supervisor supervisor(config, sinks_, signals_);
  if (options_.min_ranks > 0) {
    GrowthConfig growth;
    growth.restart_failed = options_.restart_failed;
    growth.max_ranks =
        options_.max_ranks > 0 ? options_.max_ranks : options_.num_ranks;
    growth.discovery_script = options_.discovery_script;
    const std::vector<std::string> parent = process_environment();
    const JobContext job = context();
    supervisor.enable_growth(
        growth, [this, parent, job](const std::string& host, int member) {
          return joiner_launch(options_, parent, job, host, member);
        });
  }
  supervisor.start(
      launches,
      options_.command,
      secret_.bytes(),
      ChildSetup{&signals_, parent_pid, dev_null_fd_});
  supervisor.watch();
  store_host_.stop();
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
