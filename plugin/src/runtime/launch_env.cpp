// Launcher conventions -> LaunchInfo. Each convention is tried in a fixed
// order; the first whose rank variable is present wins, and every value it
// provides is validated so a bad launch fails at start-up with its name.
#include "runtime/launch_env.h"

#include "runtime/launch_contract.h"

#include <c10/util/Exception.h>

#include <charconv>
#include <cstdlib>

namespace ronde::detail {

int parse_env_int(
    const std::string& what, const std::string& value, int lo, int hi) {
  long long v = 0;
  const char* begin = value.data();
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(begin, end, v);
  TORCH_CHECK(
      !value.empty() && ec == std::errc() && ptr == end,
      "ronde: environment variable ",
      what,
      "='",
      value,
      "' is not an integer");
  TORCH_CHECK(
      v >= lo && v <= hi,
      "ronde: environment variable ",
      what,
      "=",
      value,
      " is out of range: expected ",
      lo,
      " <= ",
      what,
      " <= ",
      hi);
  return static_cast<int>(v);
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr)
      return std::nullopt;
    return std::string(v);
  };
}

namespace {

constexpr int kMaxRanks = 1 << 24;

struct Reader {
  const EnvLookup& env;

  std::optional<std::string> str(const std::string& name) const {
    auto v = env(name);
    if (v && v->empty())
      return std::nullopt;
    return v;
  }
  std::optional<int> num(const std::string& name, int lo, int hi) const {
    auto v = str(name);
    if (!v)
      return std::nullopt;
    return parse_env_int(name, *v, lo, hi);
  }
  int required(
      const std::string& name,
      int lo,
      int hi,
      const std::string& source) const {
    auto v = num(name, lo, hi);
    TORCH_CHECK(
        v.has_value(),
        "ronde: ",
        source,
        " launch detected but ",
        name,
        " is not set");
    return *v;
  }
};

// Slurm writes tasks per node as "4(x2),3": the first count is ours when all
// nodes are alike, which is the only layout local_size can describe.
std::optional<int> slurm_leading_count(const std::optional<std::string>& v) {
  if (!v)
    return std::nullopt;
  size_t n = 0;
  while (n < v->size() && std::isdigit(static_cast<unsigned char>((*v)[n])))
    ++n;
  if (n == 0)
    return std::nullopt;
  return parse_env_int("SLURM_NTASKS_PER_NODE", v->substr(0, n), 1, kMaxRanks);
}

void validate(
    LaunchInfo& info,
    const std::string& rank_var,
    const std::string& size_var) {
  TORCH_CHECK(
      info.rank < info.size,
      "ronde: ",
      rank_var,
      "=",
      info.rank,
      " must be smaller than ",
      size_var,
      "=",
      info.size);
  TORCH_CHECK(
      info.local_size >= 1 && info.local_size <= info.size,
      "ronde: local size ",
      info.local_size,
      " must be between 1 and the world size ",
      info.size);
  TORCH_CHECK(
      info.local_rank < info.local_size,
      "ronde: local rank ",
      info.local_rank,
      " must be smaller than the local size ",
      info.local_size,
      " (",
      info.source,
      " launch)");
  TORCH_CHECK(
      info.cross_rank < info.cross_size,
      "ronde: cross rank ",
      info.cross_rank,
      " must be smaller than the cross size ",
      info.cross_size,
      " (",
      info.source,
      " launch)");
  if (info.size > 1) {
    TORCH_CHECK(
        !info.addr.empty(),
        "ronde: rank ",
        info.rank,
        " of ",
        info.size,
        " (",
        info.source,
        " launch) has no rendezvous address: set ",
        kRendezvousAddrVar,
        " or MASTER_ADDR");
    TORCH_CHECK(
        info.port > 0,
        "ronde: rank ",
        info.rank,
        " of ",
        info.size,
        " (",
        info.source,
        " launch) has no rendezvous port: set ",
        kRendezvousPortVar,
        " or MASTER_PORT");
  }
}

// Nodes are assumed alike (same number of ranks each), as Horovod assumes for
// its cross-rank; launchers that say otherwise give cross_* explicitly.
void derive_cross(LaunchInfo& info) {
  info.cross_size = std::max(1, info.size / info.local_size);
  info.cross_rank = info.rank / info.local_size;
  if (info.cross_rank >= info.cross_size)
    info.cross_rank = info.cross_size - 1;
}

void read_address(const Reader& r, LaunchInfo& info) {
  info.addr =
      r.str(kRendezvousAddrVar).value_or(r.str("MASTER_ADDR").value_or(""));
  if (auto p = r.num(kRendezvousPortVar, 1, 65535)) {
    info.port = *p;
  } else if (auto mp = r.num("MASTER_PORT", 1, 65535)) {
    info.port = *mp;
  }
}

}  // namespace

LaunchInfo parse_launch_env(const EnvLookup& env) {
  Reader r{env};
  LaunchInfo info;
  if (r.str(kRankVar) || r.str(kSizeVar)) {
    info.source = "ronde";
    info.size = r.required(kSizeVar, 1, kMaxRanks, "ronde");
    info.rank = r.required(kRankVar, 0, kMaxRanks, "ronde");
    info.local_rank = r.num(kLocalRankVar, 0, kMaxRanks).value_or(info.rank);
    info.local_size = r.num(kLocalSizeVar, 1, kMaxRanks).value_or(info.size);
    derive_cross(info);
    info.cross_rank =
        r.num(kCrossRankVar, 0, kMaxRanks).value_or(info.cross_rank);
    info.cross_size =
        r.num(kCrossSizeVar, 1, kMaxRanks).value_or(info.cross_size);
    read_address(r, info);
    info.job_id = r.str(kJobIdVar).value_or("default");
    info.store_hosted = r.str(kStoreHostedVar).value_or("") == "1";
    info.join_member = r.num(kElasticJoinVar, 0, kMaxRanks).value_or(-1);
    validate(info, kRankVar, kSizeVar);
  } else if (r.str("RANK") || r.str("WORLD_SIZE")) {
    info.source = "torchrun";
    info.size = r.required("WORLD_SIZE", 1, kMaxRanks, "torchrun");
    info.rank = r.required("RANK", 0, kMaxRanks, "torchrun");
    info.local_rank = r.num("LOCAL_RANK", 0, kMaxRanks).value_or(0);
    info.local_size = r.num("LOCAL_WORLD_SIZE", 1, kMaxRanks).value_or(1);
    derive_cross(info);
    info.cross_rank =
        r.num("GROUP_RANK", 0, kMaxRanks).value_or(info.cross_rank);
    read_address(r, info);
    info.job_id = r.str(kJobIdVar).value_or(
        r.str("TORCHELASTIC_RUN_ID").value_or("default"));
    // torchrun's agent hosts its store on MASTER_PORT; after a restart
    // the same store still holds the previous attempt's keys.
    info.store_hosted =
        r.str("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    if (auto restart = r.str("TORCHELASTIC_RESTART_COUNT");
        restart && *restart != "0" && !r.str(kJobIdVar)) {
      info.job_id += ".restart" + *restart;
    }
    validate(info, "RANK", "WORLD_SIZE");
  } else if (r.str("SLURM_PROCID")) {
    info.source = "slurm";
    info.size = r.required("SLURM_NTASKS", 1, kMaxRanks, "slurm");
    info.rank = r.required("SLURM_PROCID", 0, kMaxRanks, "slurm");
    info.local_rank = r.num("SLURM_LOCALID", 0, kMaxRanks).value_or(0);
    info.local_size =
        slurm_leading_count(r.str("SLURM_NTASKS_PER_NODE"))
            .value_or(
                slurm_leading_count(r.str("SLURM_TASKS_PER_NODE")).value_or(1));
    derive_cross(info);
    info.cross_rank =
        r.num("SLURM_NODEID", 0, kMaxRanks).value_or(info.cross_rank);
    info.cross_size =
        r.num("SLURM_NNODES", 1, kMaxRanks).value_or(info.cross_size);
    read_address(r, info);
    auto job = r.str("SLURM_JOB_ID");
    auto step = r.str("SLURM_STEP_ID");
    info.job_id = r.str(kJobIdVar).value_or(
        job ? "slurm-" + *job + (step ? "." + *step : "") : "default");
    validate(info, "SLURM_PROCID", "SLURM_NTASKS");
  } else if (r.str("OMPI_COMM_WORLD_RANK")) {
    info.source = "openmpi";
    info.size = r.required("OMPI_COMM_WORLD_SIZE", 1, kMaxRanks, "openmpi");
    info.rank = r.required("OMPI_COMM_WORLD_RANK", 0, kMaxRanks, "openmpi");
    info.local_rank =
        r.num("OMPI_COMM_WORLD_LOCAL_RANK", 0, kMaxRanks).value_or(0);
    info.local_size =
        r.num("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxRanks).value_or(1);
    derive_cross(info);
    read_address(r, info);
    info.job_id = r.str(kJobIdVar).value_or(
        r.str("OMPI_MCA_ess_base_jobid").value_or("default"));
    validate(info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  }
  return info;
}

}  // namespace ronde::detail
