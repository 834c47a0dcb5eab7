// The elastic job's growth: which ranks ronderun starts into a running job
// (a replacement for a failed rank, with --restart-failed; new ranks on the
// hosts a discovery script prints, up to --max-np), and where. The
// decisions are pure functions, unit tested; the supervisor starts the
// processes.
#pragma once

#include "hosts.h"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace ronde::detail {

struct GrowthConfig {
  // --restart-failed: a rank that fails is replaced on its host after the
  // cooldown, until that host has failed max_failures_per_host times.
  bool restart_failed = false;
  double cooldown_seconds = 1.0;
  int max_failures_per_host = 3;
  // --max-np: the most ranks the job grows to; 0: as started.
  int max_ranks = 0;
  // --host-discovery-script: prints "host:slots" lines; run every
  // discovery_interval_seconds while the job may grow.
  std::string discovery_script;
  double discovery_interval_seconds = 1.0;

  bool any() const {
    return restart_failed || !discovery_script.empty();
  }
};

// The name a host's ranks are counted under: "" for this host.
std::string host_key(const std::string& host);

// The hosts a discovery script printed: "host:slots" (or "host", one slot)
// per line, blank lines and '#' comments skipped. An error instead.
std::string parse_discovery(
    const std::string& output, std::vector<HostSlots>& hosts);

// Runs `script` through sh and returns its output in `output`; an error
// (it could not run, or exited non-zero) instead.
std::string run_discovery(const std::string& script, std::string& output);

// The hosts new ranks go to, one entry per rank: the discovered hosts'
// free slots (slots less `running` there, keyed by host_key), in the
// script's order, while the job stays within max_ranks; blacklisted hosts
// get none.
std::vector<std::string> plan_growth(
    const std::vector<HostSlots>& discovered,
    const std::map<std::string, int>& running,
    int max_ranks,
    const std::set<std::string>& blacklist);

}  // namespace ronde::detail
