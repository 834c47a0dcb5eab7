// Starting one rank: its output pipes, an optional stdin that carries the
// job secret, its own process group, and the exec of its command under its
// environment, with the signal dispositions ronderun found restored.
#pragma once

#include "output.h"
#include "signals.h"

#include <sys/types.h>

#include <string>
#include <vector>

namespace ronde::detail {

// What every child needs from the launcher, the same for all ranks.
struct ChildSetup {
  const SignalForwarding* signals = nullptr;
  pid_t parent_pid = -1;  // a child whose parent is already gone gives up
  int dev_null_fd = -1;   // the stdin of a rank without a secret to read
};

struct SpawnedRank {
  pid_t pid = -1;  // also the process group id
  int out_fd = -1;
  int err_fd = -1;
};

// Starts rank `index` as `argv` under `env`, writing `stdin_bytes` (at most
// a pipe's worth) to its stdin when not empty. On failure says why through
// `sinks` and returns false.
bool spawn_rank(
    int index,
    const std::vector<std::string>& argv,
    const std::vector<std::string>& env,
    const std::string& stdin_bytes,
    const ChildSetup& setup,
    Sinks& sinks,
    SpawnedRank& spawned);

}  // namespace ronde::detail
