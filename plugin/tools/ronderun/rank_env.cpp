// The ranks' environment and remote argv (see rank_env.h).
#include "rank_env.h"

#include "runtime/launch_contract.h"

#include <algorithm>

extern char** environ;

namespace ronde::detail {
namespace {

std::string name_of(const std::string& entry) {
  return entry.substr(0, entry.find('='));
}

// Always this job's: an enclosing job's values must never leak in.
bool is_own_variable(const std::string& name, const Options& options) {
  for (const char* own :
       {kRankVar,
        kSizeVar,
        kLocalRankVar,
        kLocalSizeVar,
        kCrossRankVar,
        kCrossSizeVar,
        kRendezvousAddrVar,
        kRendezvousPortVar,
        kJobIdVar,
        kJobSecretFileVar,
        kStoreHostedVar,
        kElasticJoinVar}) {
    if (name == own) {
      return true;
    }
  }
  // Replaced when given, else inherited.
  return (name == kTimeoutSecondsVar && options.timeout_seconds) ||
         (name == kElasticMinRanksVar && options.min_ranks > 0) ||
         (name == kTimelineVar && !options.timeline_dir.empty()) ||
         name == kBindToVar;
}

std::vector<std::string> forwarded_names(const std::vector<std::string>& x) {
  std::vector<std::string> names = {
      "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV"};
  for (const std::string& e : x) {
    names.push_back(name_of(e));
  }
  return names;
}

bool forwarded(const std::string& name, const std::vector<std::string>& extra) {
  for (const char* prefix : {"RONDE_", "GLOO_", "NCCL_", "OMP_"}) {
    if (name.rfind(prefix, 0) == 0) {
      return true;
    }
  }
  return std::find(extra.begin(), extra.end(), name) != extra.end();
}

std::string variable(const char* name, const std::string& value) {
  return std::string(name) + "=" + value;
}

}  // namespace

std::vector<RankSlot> assign_slots(
    const std::vector<HostSlots>& hosts, int num_ranks) {
  std::vector<RankSlot> slots;
  std::vector<int> used(hosts.size(), 0);
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (int k = 0;
         k < hosts[h].slots && static_cast<int>(slots.size()) < num_ranks;
         ++k) {
      RankSlot s;
      s.host = hosts[h].host;
      s.host_index = static_cast<int>(h);
      s.local_rank = used[h]++;
      slots.push_back(s);
    }
  }
  // A host with no slots left over for a local rank has no place in that
  // rank's cross group.
  for (RankSlot& s : slots) {
    s.local_size = used[static_cast<size_t>(s.host_index)];
    s.cross_rank = 0;
    s.cross_size = 0;
    for (size_t g = 0; g < hosts.size(); ++g) {
      if (used[g] > s.local_rank) {
        s.cross_rank += static_cast<int>(g) < s.host_index ? 1 : 0;
        ++s.cross_size;
      }
    }
  }
  return slots;
}

std::vector<std::string> base_environment(
    const Options& options, const std::vector<std::string>& parent_env) {
  std::vector<std::string> base;
  for (const std::string& entry : parent_env) {
    if (!is_own_variable(name_of(entry), options)) {
      base.push_back(entry);
    }
  }
  for (const std::string& x : options.exports) {
    if (x.find('=') != std::string::npos) {
      base.push_back(x);
    }
  }
  return base;
}

std::vector<std::string> rank_variables(
    const Options& options,
    int rank,
    const RankSlot& slot,
    const std::string& secret_file) {
  std::vector<std::string> own = {
      variable(kRankVar, std::to_string(rank)),
      variable(kSizeVar, std::to_string(options.num_ranks)),
      variable(kLocalRankVar, std::to_string(slot.local_rank)),
      variable(kLocalSizeVar, std::to_string(slot.local_size)),
      variable(kCrossRankVar, std::to_string(slot.cross_rank)),
      variable(kCrossSizeVar, std::to_string(slot.cross_size)),
      variable(kRendezvousAddrVar, options.host),
      variable(kRendezvousPortVar, std::to_string(options.port)),
      variable(kJobIdVar, options.job_id),
  };
  // A remote rank gets its own copy of the secret (remote_argv).
  if (!secret_file.empty() && (slot.host.empty() || is_local_host(slot.host))) {
    own.push_back(variable(kJobSecretFileVar, secret_file));
  }
  if (options.timeout_seconds) {
    own.push_back(
        variable(kTimeoutSecondsVar, std::to_string(*options.timeout_seconds)));
  }
  own.push_back(variable(kBindToVar, options.bind_to));
  if (options.min_ranks > 0) {
    own.push_back(variable(kStoreHostedVar, "1"));
    own.push_back(
        variable(kElasticMinRanksVar, std::to_string(options.min_ranks)));
  }
  if (!options.timeline_dir.empty()) {
    own.push_back(variable(
        kTimelineVar,
        options.timeline_dir + "/timeline." + kRankPlaceholder + ".json"));
  }
  return own;
}

std::vector<std::string> remote_environment(
    const std::vector<std::string>& env,
    const std::vector<std::string>& exports) {
  const std::vector<std::string> extra = forwarded_names(exports);
  std::vector<std::string> out;
  for (const std::string& e : env) {
    if (forwarded(name_of(e), extra)) {
      out.push_back(e);
    }
  }
  return out;
}

namespace {

// One rank's launch: the base environment, the rank's variables and
// `extra`; through the remote template when its host is another.
RankLaunch launch_at(
    const Options& options,
    const std::vector<std::string>& base,
    int rank,
    const RankSlot& slot,
    const JobContext& job,
    const std::vector<std::string>& extra = {}) {
  RankLaunch launch;
  launch.host = slot.host;
  launch.env = base;
  for (std::string& v : rank_variables(options, rank, slot, job.secret_file)) {
    launch.env.push_back(std::move(v));
  }
  launch.env.insert(launch.env.end(), extra.begin(), extra.end());
  if (!slot.host.empty() && !is_local_host(slot.host)) {
    launch.argv = remote_argv(
        options.rsh,
        slot.host,
        remote_environment(launch.env, options.exports),
        job.cwd,
        options.command,
        job.secret_on_stdin);
  }
  return launch;
}

}  // namespace

std::vector<RankLaunch> rank_launches(
    const Options& options,
    const std::vector<std::string>& parent_env,
    const JobContext& job) {
  const std::vector<std::string> base = base_environment(options, parent_env);
  std::vector<HostSlots> hosts = options.hosts;
  if (hosts.empty()) {
    hosts.push_back({"", options.num_ranks});
  }
  const std::vector<RankSlot> slots = assign_slots(hosts, options.num_ranks);
  std::vector<RankLaunch> launches;
  for (size_t r = 0; r < slots.size(); ++r) {
    launches.push_back(
        launch_at(options, base, static_cast<int>(r), slots[r], job));
  }
  return launches;
}

RankLaunch joiner_launch(
    const Options& options,
    const std::vector<std::string>& parent_env,
    const JobContext& job,
    const std::string& host,
    int member) {
  // A world of one until the job admits it.
  Options one = options;
  one.num_ranks = 1;
  RankSlot slot;
  slot.host = host;
  return launch_at(
      one,
      base_environment(options, parent_env),
      0,
      slot,
      job,
      {variable(kElasticJoinVar, std::to_string(member))});
}

std::vector<std::string> process_environment() {
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    env.emplace_back(*entry);
  }
  return env;
}

}  // namespace ronde::detail
