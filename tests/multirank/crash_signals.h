// The signals that mean a rank crashed (as opposed to being killed): the
// worker reports its stack on them, and the harness stops a job whose rank
// died of one (JobSpec::crash_grace).
#pragma once

#include <signal.h>

namespace ronde::testing {

struct CrashSignal {
  int number;
  const char* name;
};

constexpr CrashSignal kCrashSignals[] = {
    {SIGSEGV, "SIGSEGV"},
    {SIGBUS, "SIGBUS"},
    {SIGILL, "SIGILL"},
    {SIGFPE, "SIGFPE"},
    {SIGABRT, "SIGABRT"}};

// The signal's name if it is a crash signal, else nullptr (async-signal
// safe: the worker's crash report calls it in its handler).
inline const char* crash_signal_name(int sig) {
  for (const CrashSignal& s : kCrashSignals) {
    if (s.number == sig)
      return s.name;
  }
  return nullptr;
}

inline bool is_crash_signal(int sig) {
  return crash_signal_name(sig) != nullptr;
}

}  // namespace ronde::testing
