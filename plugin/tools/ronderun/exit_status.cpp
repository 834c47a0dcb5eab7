// Signal names and exit codes of the ranks (see exit_status.h).
#include "exit_status.h"

#include "options.h"

#include <signal.h>
#include <sys/wait.h>

namespace ronde::detail {

std::string signal_name(int signo) {
  switch (signo) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return std::to_string(signo);
  }
}

RankExit rank_exit(int status) {
  RankExit e;
  if (WIFEXITED(status)) {
    e.code = WEXITSTATUS(status);
    e.how = "exited with code " + std::to_string(e.code);
  } else if (WIFSIGNALED(status)) {
    e.code = 128 + WTERMSIG(status);
    e.how = "was killed by signal " + signal_name(WTERMSIG(status));
  } else {
    e.code = kFailureExitCode;
    e.how = "ended with wait status " + std::to_string(status);
  }
  return e;
}

}  // namespace ronde::detail
