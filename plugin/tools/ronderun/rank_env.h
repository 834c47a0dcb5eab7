// What each rank is started with: its place among the hosts, its
// environment (the parent's, less this job's own variables, plus the
// RONDE_* launch contract), and for a rank on another host the
// remote-command words. Pure: the parent's environment is passed in.
#pragma once

#include "options.h"

#include <string>
#include <vector>

namespace ronde::detail {

// A rank's host and its local and cross places, as Horovod defines them.
struct RankSlot {
  std::string host;  // empty: this host, without -H
  int host_index = 0;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
};

// Ranks fill the hosts in order, each up to its slots.
std::vector<RankSlot> assign_slots(
    const std::vector<HostSlots>& hosts, int num_ranks);

// What the job adds to the options: its secret and where it was started.
struct JobContext {
  std::string secret_file;       // told to the ranks on this host
  bool secret_on_stdin = false;  // remote ranks read the secret from stdin
  std::string cwd;  // remote ranks cd here first; empty: they do not
};

struct RankLaunch {
  std::vector<std::string> env;   // NAME=VALUE, as execve takes them
  std::vector<std::string> argv;  // empty: the command itself, here
  std::string host;               // the slot's host; empty: this host
};

// The parent's variables the ranks inherit: all but the job's own (an
// inherited timeout stays unless --timeout replaces it), then -x's
// NAME=VALUE entries.
std::vector<std::string> base_environment(
    const Options& options, const std::vector<std::string>& parent_env);

// The launch contract's variables for rank `rank` in `slot`.
std::vector<std::string> rank_variables(
    const Options& options,
    int rank,
    const RankSlot& slot,
    const std::string& secret_file);

// The subset of `env` a remote rank gets: ronde's own, the communication
// libraries', the ones that find programs and libraries, and -x's names.
std::vector<std::string> remote_environment(
    const std::vector<std::string>& env,
    const std::vector<std::string>& exports);

// Every rank's environment and, for ranks on other hosts, argv.
std::vector<RankLaunch> rank_launches(
    const Options& options,
    const std::vector<std::string>& parent_env,
    const JobContext& job);

// A process started into a running elastic job on `host` (empty or local:
// this host) as member `member`: a world of one (RONDE_RANK=0,
// RONDE_SIZE=1) that joins at the members' next commit
// (RONDE_ELASTIC_JOIN=member).
RankLaunch joiner_launch(
    const Options& options,
    const std::vector<std::string>& parent_env,
    const JobContext& job,
    const std::string& host,
    int member);

// The process's own environment, for rank_launches.
std::vector<std::string> process_environment();

}  // namespace ronde::detail
