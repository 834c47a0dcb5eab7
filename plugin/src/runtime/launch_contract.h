// The launch contract: the variables ronderun sets for its ranks and the
// limits both sides hold to, named once for the launcher (plugin/tools) and
// the ranks (launch_env, settings, auth). Header-only, no LibTorch.
#pragma once

#include <cstddef>
#include <string>

namespace ronde::detail {

// The rank's place in the job (parse_launch_env reads them first).
constexpr char kRankVar[] = "RONDE_RANK";
constexpr char kSizeVar[] = "RONDE_SIZE";
constexpr char kLocalRankVar[] = "RONDE_LOCAL_RANK";
constexpr char kLocalSizeVar[] = "RONDE_LOCAL_SIZE";
constexpr char kCrossRankVar[] = "RONDE_CROSS_RANK";
constexpr char kCrossSizeVar[] = "RONDE_CROSS_SIZE";

// Where rank 0 hosts the rendezvous store, and the job it belongs to.
constexpr char kRendezvousAddrVar[] = "RONDE_RENDEZVOUS_ADDR";
constexpr char kRendezvousPortVar[] = "RONDE_RENDEZVOUS_PORT";
constexpr char kJobIdVar[] = "RONDE_JOB_ID";
// "1": the launcher hosts the store at that address (an elastic job's
// store outlives every rank); every rank joins it as a client.
constexpr char kStoreHostedVar[] = "RONDE_STORE_HOSTED";
// An elastic job (ronderun --min-np): the fewest ranks it goes on with
// after a failure. Read as a setting by every rank.
constexpr char kElasticMinRanksVar[] = "RONDE_ELASTIC_MIN_NP";
// A process ronderun starts into a running elastic job (a replacement, or
// growth): its member id. It starts as a world of one (RONDE_RANK=0,
// RONDE_SIZE=1) and joins the job at the members' next commit.
constexpr char kElasticJoinVar[] = "RONDE_ELASTIC_JOIN";

// Set by --timeout and --timeline; read as settings by every rank.
constexpr char kTimeoutSecondsVar[] = "RONDE_TIMEOUT_SECONDS";
constexpr char kTimelineVar[] = "RONDE_TIMELINE";
// Set by --bind-to (core unless told otherwise); read as a setting.
constexpr char kBindToVar[] = "RONDE_BIND_TO";
// In a RONDE_TIMELINE path, replaced by each rank with its rank.
constexpr char kRankPlaceholder[] = "{rank}";

// Replaces the first kRankPlaceholder in `path` with `rank`; false when
// there is none. The metrics file (--metrics-out) takes the same form.
inline bool substitute_rank(std::string& path, int rank) {
  const size_t at = path.find(kRankPlaceholder);
  if (at == std::string::npos) {
    return false;
  }
  path.replace(at, sizeof(kRankPlaceholder) - 1, std::to_string(rank));
  return true;
}

// The path of the job secret (docs/security.md); never the secret itself.
constexpr char kJobSecretFileVar[] = "RONDE_JOB_SECRET_FILE";
// A secret or key file larger than this is a mistake (a wrong path), not a
// key: the ranks refuse it, and ronderun hands on no more, which also keeps
// it within what a pipe holds without a reader.
constexpr size_t kMaxSecretBytes = 4096;
// The fewest bytes a job secret may have once trailing whitespace is
// dropped; ronderun makes 64 (32 random bytes as hex).
constexpr size_t kMinJobSecretBytes = 16;

}  // namespace ronde::detail
