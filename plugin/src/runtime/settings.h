// Every environment variable ronde reads (other than the launcher's, see
// launch_env.h), parsed and checked in one place. init() takes one snapshot
// and hands it to the parts it builds; a bad value fails init() with the
// variable's name instead of failing later, in the middle of training.
#pragma once

#include "runtime/launch_env.h"
#include "runtime/tuning.h"

#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {

struct Settings {
  // RONDE_TIMEOUT_SECONDS: rendezvous and collective timeout.
  std::optional<double> timeout_seconds;
  // RONDE_HOSTNAME: the address this rank's transport advertises.
  std::string hostname;
  // RONDE_SOCKET_IFNAME (else GLOO_SOCKET_IFNAME): the interfaces whose
  // address a rank advertises; socket_ifname_variable says which was set.
  std::string socket_ifname;
  std::string socket_ifname_variable;
  // RONDE_HIERARCHICAL: the two-level all-reduce across hosts; unset: on
  // when several hosts run several ranks each.
  std::optional<bool> hierarchical;
  // RONDE_GLOO_ALGORITHM: "ring" or "bcube" (checked by the Gloo backend,
  // which InitOptions::gloo_algorithm reaches too).
  GlooTuning gloo_tuning;
  // RONDE_GLOO_MODULE: path of the Gloo backend module; empty: next to
  // libronde.
  std::string gloo_module;
  // RONDE_GLOO_DEEPBIND: open that module with RTLD_DEEPBIND; unset: by
  // build (off under the sanitizers, which refuse it).
  std::optional<bool> gloo_deepbind;
  // RONDE_CUDA_BACKEND: "nccl" or "gloo"; empty: by build.
  std::string cuda_backend;
  // RONDE_BLOCKING_WAIT=1: Handle::wait() on device work blocks the host.
  bool blocking_wait = false;
  // RONDE_STALL_WARNING_SECONDS / RONDE_STALL_SHUTDOWN_SECONDS.
  std::optional<double> stall_warning_seconds;
  std::optional<double> stall_shutdown_seconds;
  // RONDE_TIMELINE: where to write the timeline; empty: none.
  std::string timeline;
  // USE_LIBUV (PyTorch's): false runs the store server without libuv.
  bool use_libuv = true;
  // RONDE_FUSION_THRESHOLD: the bucket size in bytes.
  std::optional<double> fusion_threshold_bytes;
  // RONDE_BUCKET_COPY: "whole" (true), "multi" (false), unset: by device.
  std::optional<bool> bucket_copy_whole;
  // RONDE_AUTOTUNE: tune the bucket sizes on the running job (unset: the
  // option's value).
  std::optional<bool> autotune;
  // RONDE_LOG_ALL_RANKS: progress lines on every rank.
  bool log_all_ranks = false;
  // RONDE_HELP_BYTES: the largest queued collective (bytes per rank) a
  // thread waiting on it runs itself (CommWorker::help); unset: any.
  std::optional<size_t> help_bytes;
  // RONDE_BIND_TO: core, socket or none (empty: none): the CPUs init()
  // binds the rank to (runtime/cpu_binding.h); ronderun sets core.
  std::string bind_to;
  // RONDE_SHM=0: ranks of one host use Gloo, not shared memory.
  bool shm = true;
  // RONDE_SHM_DIR, RONDE_SHM_CHUNK_BYTES (at least
  // ShmTuning::kMinChunkBytes), RONDE_SHM_SPLIT_BYTES, RONDE_SHM_ARENA_BYTES.
  ShmTuning shm_tuning;
  // RONDE_JOB_SECRET_FILE: the job secret (docs/security.md); empty: the
  // job is not authenticated.
  std::string job_secret_file;
  // RONDE_CHECKPOINT_KEY_FILE: the default key of every Checkpointer.
  std::string checkpoint_key_file;
  // RONDE_ELASTIC_MIN_NP: the fewest ranks an elastic job goes on with
  // after a failure (ronderun --min-np sets it).
  int elastic_min_ranks = 1;
};

// Parses every variable that `env` holds; throws c10::Error naming the
// variable and its value when one is malformed. Pure: unit tested.
Settings read_settings(const EnvLookup& env);

// The names read_settings() reads, in the order of the guide's Settings
// table (a unit test holds the two to the same set).
const std::vector<std::string>& setting_variables();

// The settings of the running job: the snapshot init() took. Outside a job
// (before init(), after shutdown(): tools, benchmarks, unit tests) the
// environment is read anew at each call.
Settings settings();

// Called by init() and shutdown().
void install_settings(const Settings& s);
void clear_settings();

// A positive number from the variable `name` as found in `env`: nullopt when
// unset or empty; c10::Error naming the variable when it is not positive.
// `unit` says what the number counts, for the message.
std::optional<double> positive_env_number(
    const EnvLookup& env, const char* name, const char* unit);

}  // namespace ronde::detail
