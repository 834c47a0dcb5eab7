// ronderun's command line: the Options it fills, the usage text, and
// parse_args, which validates every value and words each refusal.
#pragma once

#include "hosts.h"

#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {

constexpr int kUsageExitCode = 2;
constexpr int kFailureExitCode = 1;

// Used when neither --host nor -H says otherwise.
constexpr const char* kDefaultHost = "127.0.0.1";
constexpr const char* kDefaultRsh = "ssh -o BatchMode=yes {host}";

extern const char kUsage[];

struct Options {
  int num_ranks = 0;
  std::vector<HostSlots> hosts;  // empty: every rank on this host
  std::string rsh = kDefaultRsh;
  std::vector<std::string> exports;  // -x
  bool host_given = false;
  std::optional<long> timeout_seconds;
  std::string job_id;
  int port = 0;
  std::string host = kDefaultHost;
  std::string timeline_dir;  // --timeline
  // --bind-to: each rank's CPUs (RONDE_BIND_TO): core, socket or none.
  std::string bind_to = "core";
  // --min-np: an elastic job (the store is hosted here, a failed rank does
  // not end the job); 0: not elastic.
  int min_ranks = 0;
  // --max-np, --host-discovery-script, --restart-failed: the growth of an
  // elastic job (GrowthConfig).
  int max_ranks = 0;
  std::string discovery_script;
  bool restart_failed = false;
  bool prefix = true;
  bool verbose = false;
  bool help = false;
  std::vector<std::string> command;
};

// Returns an error message, or an empty string when the arguments are valid
// (also when -h asked for help: options.help is then set).
std::string parse_args(int argc, char** argv, Options& options);

}  // namespace ronde::detail
