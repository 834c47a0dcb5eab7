// Reads rank, size and the rendezvous address from the environment that a
// launcher set: ronderun's own variables first, then torchrun's, Slurm's and
// Open MPI's. Pure (the environment comes in as a function) so it is unit
// tested without touching the process environment.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace ronde::detail {

struct LaunchInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  std::string addr;  // rendezvous host (rank 0 hosts the store there)
  int port = 0;
  std::string job_id = "default";
  // The launcher already hosts a store at addr:port (torchrun's agent,
  // TORCHELASTIC_USE_AGENT_STORE=True): every rank joins it as a client.
  // Also ronderun's elastic store (RONDE_STORE_HOSTED=1).
  bool store_hosted = false;
  // The membership epoch: 0 at init(), one more at each change of world in
  // an elastic job. Every store key of a later epoch is apart from those of
  // earlier ones (job_key()).
  uint64_t epoch = 0;
  // How many init()s this process made before this one: a world made again
  // after shutdown() keeps its keys apart from the last one's, which a
  // store that outlives the ranks (or a peer's late reads) still holds.
  int incarnation = 0;
  // RONDE_ELASTIC_JOIN: the member id of a process started into a running
  // elastic job; -1 for the job's own ranks.
  int join_member = -1;
  // Which convention supplied the values: "ronde", "torchrun", "slurm",
  // "openmpi", or "none" (no launcher: one process, no network).
  std::string source = "none";
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Throws c10::Error naming the variable and the bad value.
LaunchInfo parse_launch_env(const EnvLookup& env);

// The process environment as an EnvLookup.
EnvLookup process_env();

// Strict integer parsing for environment values: the whole string must be a
// base-10 integer in [lo, hi]. `what` names the variable in the error.
int parse_env_int(
    const std::string& what, const std::string& value, int lo, int hi);

}  // namespace ronde::detail
