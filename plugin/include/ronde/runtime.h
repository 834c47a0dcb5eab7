// Start-up and shutdown of a ronde job, and where this process sits in it.
// init() reads the launcher's environment (ronderun, torchrun, Slurm, Open
// MPI), meets the other ranks through a key-value store hosted by rank 0,
// and connects the communicators.
#pragma once

#include <ronde/process_set.h>

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ronde {

struct InitOptions {
  // Timeout of the rendezvous and of every blocking collective, in seconds.
  // 0: take RONDE_TIMEOUT_SECONDS, else 30 s (long enough for a slow start,
  // short enough that a dead peer is noticed within a coffee break).
  TORCH_ARG(double, timeout_seconds) = 0;
  // Address this rank's Gloo transport listens on and advertises. Empty:
  // RONDE_HOSTNAME, else the first address of an interface that
  // RONDE_SOCKET_IFNAME (else GLOO_SOCKET_IFNAME) names, else 127.0.0.1 for
  // a rendezvous on loopback, else the local address of the route to the
  // rendezvous address. A job across hosts in which a rank would advertise
  // a loopback address fails at init(), naming the rank.
  TORCH_ARG(std::string, hostname) = "";
  // Gloo all-reduce algorithm: "ring" (bandwidth-optimal, the default) or
  // "bcube". Empty: RONDE_GLOO_ALGORITHM, else "ring".
  TORCH_ARG(std::string, gloo_algorithm) = "";
  // Process sets to create once the job is connected, in this order (as
  // add_process_set() would; every rank passes the same). The handles given
  // here become usable: their ids, ranks and communicators are set.
  TORCH_ARG(std::vector<ProcessSet>, process_sets) = {};
  // File holding the job secret, which authenticates the ranks at
  // rendezvous and every value they trust from the store (docs/security.md).
  // Empty: RONDE_JOB_SECRET_FILE, which ronderun sets for its ranks; with
  // neither, the job is not authenticated. Private to its owner (mode 0600),
  // 16 to 4096 bytes.
  TORCH_ARG(std::string, job_secret_file) = "";
};

// Joins the job. Calling it again while initialised does nothing. Throws
// c10::Error for a bad environment and ronde::CommError when the other ranks
// cannot be reached in time or belong to another job.
void init(const InitOptions& options = {});
// Leaves the job: waits for queued collectives, meets the other ranks at a
// barrier when the communicator is healthy, then closes everything.
void shutdown();
bool is_initialized();

int rank();
int size();
// Where this rank sits, as the ranks observed it at init() (ranks with the
// same boot id and network namespace share a host), not as the launcher
// said: local_rank among its host's ranks (in rank order), local_size
// ranks on its host; cross_rank and cross_size as Horovod's: the ranks with
// this local rank, one per host, hosts in the order of their lowest rank.
int local_rank();
int local_size();
int cross_rank();
int cross_size();
// The job id every rank checked at rendezvous.
std::string job_id();
// The timeout applied to blocking calls, in seconds.
double timeout_seconds();

// The backend that carries this job's CPU tensors: "shm" (shared memory,
// every rank on one host), "hierarchical" (several hosts with several ranks
// each: shared memory within a host, Gloo across), "gloo" (TCP), or "self"
// (one rank).
std::string host_backend();

// cuda:<local_rank mod device count> when LibTorch has CUDA devices, else CPU.
c10::Device device();

// Whether this ronde was built with the NCCL backend (RONDE_WITH_NCCL): CUDA
// tensors then go to NCCL unless RONDE_CUDA_BACKEND=gloo. Needs no init().
bool nccl_built();

namespace elastic {

// What a change of world gave.
struct WorldChange {
  int64_t epoch = 0;  // the membership epoch now in force (0 at init())
  int old_rank = 0;
  int old_size = 1;
  int rank = 0;
  int size = 1;
  // The new world's ranks, by rank, as their ranks at launch (which a
  // process keeps for life).
  std::vector<int> members;
};

// The change of world run() makes after a failure, for a loop of one's own
// (the Python binding's): drops every communicator of this world (added
// process sets too: their handles then refuse use), meets the other
// survivors in the store under the next membership epoch, leaving out
// `suspect_ranks` (ranks of this world, from the CommError) and whoever
// does not come within the timeout, and connects the new world; survivors
// keep their order, so the lowest becomes rank 0. Throws CommError of kind
// Rendezvous, with ronde shut down, when fewer ranks than
// RONDE_ELASTIC_MIN_NP are left within the timeout, when the store is gone
// (hosted by a rank that died: run under ronderun --min-np), or when this
// rank was left out.
WorldChange change_world(const std::vector<int>& suspect_ranks);

// Growth, for loops of one's own (run() and State::commit() do this). A
// collective: whether processes wait to join the job (rank 0 asks the
// store; every rank gets its answer).
bool check_host_updates();
// A collective of the members when check_host_updates() said so: the
// waiting processes are admitted, and every member and joiner forms the
// next world together, keeping the members' order (joiners after them).
// Throws as change_world() does.
WorldChange admit_joiners();
// Whether this process was started into a running elastic job (ronderun
// --restart-failed or --host-discovery-script: RONDE_ELASTIC_JOIN) and is
// not part of it yet; until then it is a world of one.
bool joining();
// Blocks until the members admit this process at a commit, then forms the
// next world with them. Returns rank -1 when the job's training ended
// first (the process is then still a world of one, and may shut down).
WorldChange join_world();
// Rank 0, when training is over: processes still waiting to join give up
// (join_world() returns rank -1). Nothing elsewhere.
void close_to_joiners();

}  // namespace elastic
}  // namespace ronde
