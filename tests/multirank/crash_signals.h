// The signals that mean a rank crashed (as opposed to being killed): the
// worker reports its stack on them, and the harness stops a job whose rank
// died of one (JobSpec::crash_grace).
#pragma once

#include <signal.h>

namespace ronde::testing {

constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

inline bool is_crash_signal(int sig) {
  for (int s : kCrashSignals) {
    if (s == sig)
      return true;
  }
  return false;
}

}  // namespace ronde::testing
