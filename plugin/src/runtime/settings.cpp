// Settings: the one place that reads ronde's environment variables.
#include "runtime/settings.h"

#include "runtime/launch_contract.h"
#include "runtime/launch_env.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>

namespace ronde::detail {
namespace {

std::mutex g_mutex;
std::optional<Settings> g_installed;  // guarded by g_mutex

std::string text(const EnvLookup& env, const char* name) {
  return env(name).value_or("");
}

// Booleans take the usual spellings; anything else is a typo worth an error
// (a silent "off" for RONDE_BLOCKING_WAIT=true would be a trap).
std::optional<bool> flag(const EnvLookup& env, const char* name) {
  const std::string v = text(env, name);
  if (v.empty())
    return std::nullopt;
  for (const char* on : {"1", "true", "on", "yes"}) {
    if (v == on)
      return true;
  }
  for (const char* off : {"0", "false", "off", "no"}) {
    if (v == off)
      return false;
  }
  TORCH_CHECK(
      false,
      "ronde: ",
      name,
      "='",
      v,
      "' is not a boolean: expected 1 or 0 (true/false, on/off, yes/no)");
}

// A whole number of bytes; 0 is allowed.
std::optional<size_t> byte_count(const EnvLookup& env, const char* name) {
  const std::string v = text(env, name);
  if (v.empty())
    return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  TORCH_CHECK(
      end != v.c_str() && *end == '\0' && errno == 0 && v[0] != '-',
      "ronde: ",
      name,
      "='",
      v,
      "' is not a whole number of bytes");
  return static_cast<size_t>(x);
}

}  // namespace

std::optional<double> positive_env_number(
    const EnvLookup& env, const char* name, const char* unit) {
  const std::string v = text(env, name);
  if (v.empty())
    return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  TORCH_CHECK(
      end != v.c_str() && *end == '\0' && x > 0,
      "ronde: ",
      name,
      "='",
      v,
      "' is not a positive number of ",
      unit);
  return x;
}

const std::vector<std::string>& setting_variables() {
  static const std::vector<std::string> names = {
      kTimeoutSecondsVar,
      "RONDE_HOSTNAME",
      "RONDE_SOCKET_IFNAME",
      "GLOO_SOCKET_IFNAME",
      "RONDE_HIERARCHICAL",
      "RONDE_GLOO_ALGORITHM",
      "RONDE_GLOO_MODULE",
      "RONDE_FUSION_THRESHOLD",
      "RONDE_GLOO_DEEPBIND",
      "RONDE_CUDA_BACKEND",
      "RONDE_BLOCKING_WAIT",
      "RONDE_STALL_WARNING_SECONDS",
      "RONDE_STALL_SHUTDOWN_SECONDS",
      kTimelineVar,
      "USE_LIBUV",
      "RONDE_BUCKET_COPY",
      "RONDE_AUTOTUNE",
      "RONDE_LOG_ALL_RANKS",
      "RONDE_HELP_BYTES",
      kBindToVar,
      "RONDE_SHM",
      "RONDE_SHM_DIR",
      "RONDE_SHM_CHUNK_BYTES",
      "RONDE_SHM_SPLIT_BYTES",
      "RONDE_SHM_ARENA_BYTES",
      "RONDE_SHM_ZERO_COPY_BYTES",
      kJobSecretFileVar,
      "RONDE_CHECKPOINT_KEY_FILE",
      kElasticMinRanksVar,
  };
  return names;
}

Settings read_settings(const EnvLookup& env) {
  Settings s;
  s.timeout_seconds = positive_env_number(env, kTimeoutSecondsVar, "seconds");
  s.hostname = text(env, "RONDE_HOSTNAME");
  for (const char* name : {"RONDE_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (s.socket_ifname.empty()) {
      s.socket_ifname = text(env, name);
      if (!s.socket_ifname.empty())
        s.socket_ifname_variable = name;
    }
  }
  s.hierarchical = flag(env, "RONDE_HIERARCHICAL");
  const std::string algorithm = text(env, "RONDE_GLOO_ALGORITHM");
  if (!algorithm.empty())
    s.gloo_tuning.algorithm = algorithm;
  s.gloo_module = text(env, "RONDE_GLOO_MODULE");
  s.fusion_threshold_bytes =
      positive_env_number(env, "RONDE_FUSION_THRESHOLD", "bytes");
  s.gloo_deepbind = flag(env, "RONDE_GLOO_DEEPBIND");
  s.cuda_backend = text(env, "RONDE_CUDA_BACKEND");
  TORCH_CHECK(
      s.cuda_backend.empty() || s.cuda_backend == "nccl" ||
          s.cuda_backend == "gloo",
      "ronde: RONDE_CUDA_BACKEND must be 'nccl' or 'gloo', not '",
      s.cuda_backend,
      "'");
  s.blocking_wait = flag(env, "RONDE_BLOCKING_WAIT").value_or(false);
  s.stall_warning_seconds =
      positive_env_number(env, "RONDE_STALL_WARNING_SECONDS", "seconds");
  s.stall_shutdown_seconds =
      positive_env_number(env, "RONDE_STALL_SHUTDOWN_SECONDS", "seconds");
  s.timeline = text(env, kTimelineVar);
  s.use_libuv = flag(env, "USE_LIBUV").value_or(true);
  const std::string copy = text(env, "RONDE_BUCKET_COPY");
  TORCH_CHECK(
      copy.empty() || copy == "whole" || copy == "multi",
      "ronde: RONDE_BUCKET_COPY='",
      copy,
      "' is neither 'whole' nor 'multi'");
  if (!copy.empty())
    s.bucket_copy_whole = copy == "whole";
  s.autotune = flag(env, "RONDE_AUTOTUNE");
  s.log_all_ranks = flag(env, "RONDE_LOG_ALL_RANKS").value_or(false);
  s.bind_to = text(env, kBindToVar);
  TORCH_CHECK(
      s.bind_to.empty() || s.bind_to == "core" || s.bind_to == "socket" ||
          s.bind_to == "none",
      "ronde: RONDE_BIND_TO='",
      s.bind_to,
      "' is none of core, socket, none");
  s.shm = flag(env, "RONDE_SHM").value_or(true);
  const std::string dir = text(env, "RONDE_SHM_DIR");
  if (!dir.empty())
    s.shm_tuning.dir = dir;
  if (auto chunk = byte_count(env, "RONDE_SHM_CHUNK_BYTES")) {
    TORCH_CHECK(
        *chunk >= ShmTuning::kMinChunkBytes,
        "ronde: RONDE_SHM_CHUNK_BYTES='",
        *chunk,
        "' is below the smallest chunk, ",
        ShmTuning::kMinChunkBytes,
        " bytes");
    s.shm_tuning.chunk_bytes = *chunk;
  }
  s.help_bytes = byte_count(env, "RONDE_HELP_BYTES");
  if (auto split = byte_count(env, "RONDE_SHM_SPLIT_BYTES"))
    s.shm_tuning.split_bytes = *split;
  if (auto arena = byte_count(env, "RONDE_SHM_ARENA_BYTES"))
    s.shm_tuning.arena_bytes = *arena;
  if (auto zero_copy = byte_count(env, "RONDE_SHM_ZERO_COPY_BYTES"))
    s.shm_tuning.zero_copy_min_bytes = *zero_copy;
  s.job_secret_file = text(env, kJobSecretFileVar);
  s.checkpoint_key_file = text(env, "RONDE_CHECKPOINT_KEY_FILE");
  const std::string min_np = text(env, kElasticMinRanksVar);
  if (!min_np.empty())
    s.elastic_min_ranks =
        parse_env_int(kElasticMinRanksVar, min_np, 1, 1 << 20);
  return s;
}

Settings settings() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_installed)
      return *g_installed;
  }
  return read_settings(process_env());
}

void install_settings(const Settings& s) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_installed = s;
}

void clear_settings() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_installed.reset();
}

}  // namespace ronde::detail
