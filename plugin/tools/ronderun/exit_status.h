// How a rank ended, in the launcher's words and as its exit code: the
// rank's own code, or 128 + the signal that killed it, as a shell reports.
#pragma once

#include <string>

namespace ronde::detail {

constexpr int kExecFailedExitCode = 127;

// "SIGTERM" for SIGTERM; the number for a signal without a name here.
std::string signal_name(int signo);

struct RankExit {
  int code = 0;     // what ronderun exits with when this rank fails first
  std::string how;  // "exited with code 3", "was killed by signal SIGKILL"
};

// `status` as waitpid() reports it.
RankExit rank_exit(int status);

}  // namespace ronde::detail
