// Checks for worker scenarios: a failed check prints the rank, the line and
// the details, and counts; the scenario's exit code reports the count.
#pragma once

#include <ronde/errors.h>
#include <ronde/runtime.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "crash_signals.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <functional>
#include <iostream>
#include <string>
#include <vector>

namespace ronde::testing {

// On a crash signal, writes the signal and the stack to stderr (the rank's
// log) before dying of it, so a test reports where a rank crashed rather
// than only that it did.
inline void install_crash_report() {
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    const char* name = crash_signal_name(sig);
    const char head[] = "\n*** crash report: ";
    (void)!::write(2, head, sizeof(head) - 1);
    (void)!::write(2, name, std::char_traits<char>::length(name));
    (void)!::write(2, ", stack:\n", 9);
    void* frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    ::raise(sig);  // SA_RESETHAND restored the default action
  };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (const CrashSignal& s : kCrashSignals)
    sigaction(s.number, &sa, nullptr);
}

inline int& check_failures() {
  static int failures = 0;
  return failures;
}

inline int scenario_exit_code() {
  return check_failures() == 0 ? 0 : 1;
}

// The lines the tests parse from a rank that failed with a CommError.
inline void print_comm_error(const ronde::CommError& e) {
  std::cout << "COMM_ERROR: " << e.what() << std::endl;
  std::cout << "SUSPECTS:";
  for (int s : e.suspect_ranks())
    std::cout << " " << s;
  std::cout << std::endl;
}

}  // namespace ronde::testing

#define CHECK_W(cond, ...)                                             \
  do {                                                                 \
    if (!(cond)) {                                                     \
      ++::ronde::testing::check_failures();                            \
      std::cout << "FAILED on rank " << ::ronde::rank() << " at line " \
                << __LINE__ << ": " #cond " " << c10::str(__VA_ARGS__) \
                << std::endl;                                          \
    }                                                                  \
  } while (0)

namespace ronde::testing {

// Runs fn, expecting a c10::Error whose message contains every needle.
inline void expect_error(
    const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    CHECK_W(false, "expected an error containing '", needles[0], "'");
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::cout << "ERROR_SEEN: " << msg << std::endl;
    for (const auto& needle : needles) {
      CHECK_W(
          msg.find(needle) != std::string::npos,
          "message lacks '",
          needle,
          "': ",
          msg);
    }
  }
}

}  // namespace ronde::testing
