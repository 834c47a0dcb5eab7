// The signals ronderun forwards to its ranks (SIGINT, SIGTERM, SIGHUP) and
// SIGCHLD, caught by a handler that only sets a flag and writes a wake-up
// byte, so the poll loop does the work outside the handler.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

namespace ronde::detail {

// A signal that was ignored when ronderun started (nohup, `cmd &` in a
// script) stays ignored.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kNumForwardedSignals =
    sizeof(kForwardedSignals) / sizeof(kForwardedSignals[0]);

// One per process: the handler's state is global.
class SignalForwarding {
 public:
  // Installs the handlers and ignores SIGPIPE; returns an error, or "".
  std::string install();

  // In a forked child before exec: the dispositions ronderun found.
  void restore_in_child() const;

  // The signals to block across fork, so that a child never runs our
  // handler (and swallows a forwarded signal) before it execs.
  static sigset_t handled_set();

  static bool any_pending();
  // The forwarded signals that arrived since the last call, in
  // kForwardedSignals' order.
  static std::vector<int> take_pending();

  // The read end the poll loop watches, and emptying it after a wake-up.
  int wake_fd() const {
    return wake_read_fd_;
  }
  void drain_wake_pipe() const;

 private:
  int wake_read_fd_ = -1;
  struct sigaction original_actions_[kNumForwardedSignals] = {};
  struct sigaction original_sigchld_ = {};
  struct sigaction original_sigpipe_ = {};
};

}  // namespace ronde::detail
