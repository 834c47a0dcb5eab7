// Signal handling of the launcher (see signals.h).
#include "signals.h"

#include "fd_util.h"
#include "runtime/posix_io.h"

#include <cerrno>

namespace ronde::detail {
namespace {

// Set by the signal handler, consumed by the poll loop. Only flags and a
// wake-up byte cross from the handler, which keeps it async-signal-safe.
volatile sig_atomic_t g_pending_signals[kNumForwardedSignals] = {};
int g_wake_fd = -1;

extern "C" void on_signal(int signo) {
  const int saved_errno = errno;
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    if (kForwardedSignals[i] == signo) {
      g_pending_signals[i] = 1;
    }
  }
  const char byte = 0;
  // The pipe is non-blocking: when it is full a wake-up is pending anyway.
  ssize_t ignored = write(g_wake_fd, &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

std::string sigaction_failed() {
  return "sigaction failed: " + errno_text();
}

}  // namespace

std::string SignalForwarding::install() {
  int fds[2];
  if (pipe(fds) < 0) {
    return "cannot create a pipe: " + errno_text();
  }
  wake_read_fd_ = fds[0];
  g_wake_fd = fds[1];
  if (!set_fd_flags(fds[0], true) || !set_fd_flags(fds[1], true)) {
    return "cannot configure a pipe: " + errno_text();
  }
  struct sigaction action = {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    const int signo = kForwardedSignals[i];
    if (sigaction(signo, nullptr, &original_actions_[i]) < 0) {
      return sigaction_failed();
    }
    if (original_actions_[i].sa_handler == SIG_IGN) {
      continue;
    }
    if (sigaction(signo, &action, nullptr) < 0) {
      return sigaction_failed();
    }
  }
  struct sigaction child_action = action;
  child_action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &child_action, &original_sigchld_) < 0) {
    return sigaction_failed();
  }
  // A write to a vanished reader must fail with EPIPE rather than kill the
  // supervisor; the ranks get the original disposition back before exec.
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  if (sigaction(SIGPIPE, &ignore, &original_sigpipe_) < 0) {
    return sigaction_failed();
  }
  return "";
}

void SignalForwarding::restore_in_child() const {
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    (void)sigaction(kForwardedSignals[i], &original_actions_[i], nullptr);
  }
  (void)sigaction(SIGCHLD, &original_sigchld_, nullptr);
  (void)sigaction(SIGPIPE, &original_sigpipe_, nullptr);
}

sigset_t SignalForwarding::handled_set() {
  sigset_t blocked;
  sigemptyset(&blocked);
  for (int signo : kForwardedSignals) {
    sigaddset(&blocked, signo);
  }
  sigaddset(&blocked, SIGCHLD);
  return blocked;
}

bool SignalForwarding::any_pending() {
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    if (g_pending_signals[i] != 0) {
      return true;
    }
  }
  return false;
}

std::vector<int> SignalForwarding::take_pending() {
  std::vector<int> signals;
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    if (g_pending_signals[i] != 0) {
      g_pending_signals[i] = 0;
      signals.push_back(kForwardedSignals[i]);
    }
  }
  return signals;
}

void SignalForwarding::drain_wake_pipe() const {
  char buffer[256];
  while (true) {
    const ssize_t n = read(wake_read_fd_, buffer, sizeof(buffer));
    if (n > 0 || (n < 0 && errno == EINTR)) {
      continue;
    }
    break;
  }
}

}  // namespace ronde::detail
