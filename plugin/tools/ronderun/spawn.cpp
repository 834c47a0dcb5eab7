// Starting a rank (see spawn.h).
#include "spawn.h"

#include "exit_status.h"
#include "fd_util.h"
#include "options.h"
#include "runtime/posix_io.h"

#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>

extern char** environ;

namespace ronde::detail {
namespace {

struct RankPipes {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  int in[2] = {-1, -1};  // only for a rank that reads the secret

  void close_all() {
    for (int* p : {out, err, in}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
  }
};

// Every pipe end is close-on-exec so that no rank inherits another rank's
// write end, which would keep that pipe from ever reaching EOF.
bool make_pipes(bool with_stdin, RankPipes& p, Sinks& sinks) {
  if (pipe(p.out) < 0 || pipe(p.err) < 0) {
    sinks.message("cannot create a pipe: " + errno_text());
    return false;
  }
  if (!set_fd_flags(p.out[0], true) || !set_fd_flags(p.err[0], true) ||
      !set_fd_flags(p.out[1], false) || !set_fd_flags(p.err[1], false)) {
    sinks.message("cannot configure a pipe: " + errno_text());
    return false;
  }
  if (with_stdin && (pipe(p.in) != 0 || !set_fd_flags(p.in[0], false) ||
                     !set_fd_flags(p.in[1], false))) {
    sinks.message("cannot create a pipe: " + errno_text());
    return false;
  }
  return true;
}

std::vector<char*> c_strings(const std::vector<std::string>& words) {
  std::vector<char*> out;
  for (const std::string& w : words) {
    out.push_back(const_cast<char*>(w.c_str()));
  }
  out.push_back(nullptr);
  return out;
}

[[noreturn]] void exec_rank(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& env,
    const RankPipes& p,
    const ChildSetup& setup,
    const sigset_t& original_mask) {
  // Its own group keeps a terminal Ctrl-C from reaching the rank twice, and
  // lets one kill(-pgid) take down whatever the rank has spawned.
  (void)setpgid(0, 0);
  setup.signals->restore_in_child();
  (void)sigprocmask(SIG_SETMASK, &original_mask, nullptr);
#ifdef __linux__
  // If ronderun itself is SIGKILLed the ranks must not live on unsupervised.
  (void)prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != setup.parent_pid) {
    _exit(kFailureExitCode);
  }
#endif
  // A rank in a background process group that read the terminal would be
  // stopped by SIGTTIN, so the ranks get no stdin; one on another host
  // reads the job secret from it, then its end.
  if (dup2(p.in[0] >= 0 ? p.in[0] : setup.dev_null_fd, STDIN_FILENO) < 0 ||
      dup2(p.out[1], STDOUT_FILENO) < 0 || dup2(p.err[1], STDERR_FILENO) < 0) {
    _exit(kExecFailedExitCode);
  }
  std::vector<char*> args = c_strings(argv);
  std::vector<char*> envp = c_strings(env);
  // execvp searches PATH from environ, which is now the rank's environment.
  environ = envp.data();
  execvp(args[0], args.data());
  const std::string text =
      "ronderun: cannot run '" + argv[0] + "': " + errno_text() + "\n";
  (void)write_fully(STDERR_FILENO, text.data(), text.size());
  _exit(kExecFailedExitCode);
}

// Forks with the handled signals blocked; -1 after a message.
pid_t fork_rank(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& env,
    RankPipes& p,
    const ChildSetup& setup,
    Sinks& sinks) {
  const sigset_t blocked = SignalForwarding::handled_set();
  sigset_t original_mask;
  if (sigprocmask(SIG_BLOCK, &blocked, &original_mask) < 0) {
    sinks.message("sigprocmask failed: " + errno_text());
    return -1;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close_fd(p.out[0]);
    close_fd(p.err[0]);
    exec_rank(argv, env, p, setup, original_mask);
  }
  const int fork_errno = errno;
  if (sigprocmask(SIG_SETMASK, &original_mask, nullptr) < 0) {
    sinks.message("sigprocmask failed: " + errno_text());
  }
  if (pid < 0) {
    sinks.message("cannot fork: " + errno_text(fork_errno));
  }
  return pid;
}

}  // namespace

bool spawn_rank(
    int index,
    const std::vector<std::string>& argv,
    const std::vector<std::string>& env,
    const std::string& stdin_bytes,
    const ChildSetup& setup,
    Sinks& sinks,
    SpawnedRank& spawned) {
  RankPipes p;
  const pid_t pid = make_pipes(!stdin_bytes.empty(), p, sinks)
                        ? fork_rank(argv, env, p, setup, sinks)
                        : -1;
  close_fd(p.out[1]);
  close_fd(p.err[1]);
  close_fd(p.in[0]);
  if (pid > 0 && p.in[1] >= 0) {
    // At most kMaxSecretBytes: the pipe holds them without a reader. A
    // short write leaves the rank a wrong secret, which it is refused for.
    (void)write_fully(p.in[1], stdin_bytes.data(), stdin_bytes.size());
  }
  if (pid < 0) {
    p.close_all();
    return false;
  }
  close_fd(p.in[1]);
  // Also done here so the group exists before we might signal it; EACCES
  // means the child already exec'd, after its own setpgid.
  if (setpgid(pid, pid) < 0 && errno != EACCES && errno != ESRCH) {
    sinks.message(
        "rank " + std::to_string(index) + ": setpgid failed: " + errno_text());
  }
  spawned.pid = pid;
  spawned.out_fd = p.out[0];
  spawned.err_fd = p.err[0];
  return true;
}

}  // namespace ronde::detail
