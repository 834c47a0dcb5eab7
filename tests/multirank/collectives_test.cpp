// Multirank tests of the runtime and the collectives: real processes on
// loopback, each checking its results against a reference it computes
// itself (see worker_collectives.cpp and worker_reference.h).
#include "../scratch_dir.h"
#include "harness.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>

using ronde::testing::JobResult;
using ronde::testing::JobSpec;
using ronde::testing::run_job;
using ronde::testing::RunningJob;
using ronde::testing::worker_path;

namespace {

JobSpec spec(
    const std::string& scenario,
    int np,
    const std::string& program = worker_path()) {
  return ronde::testing::worker_spec({scenario}, np, program);
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// The ranks a survivor's CommError suspected (its "SUSPECTS:" line, each
// preceded by a space); "none" when it printed no such line.
std::string suspects_of(const std::string& output) {
  auto at = output.find("SUSPECTS:");
  if (at == std::string::npos)
    return "none";
  return output.substr(at + 9, output.find('\n', at) - at - 9);
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  return out;
}

// A directory of its own for a job's shared-memory segments, so that a test
// can see what the job left there (nothing, whatever happened).
struct ShmDir {
  std::string path = ronde::testing::make_scratch_dir("/dev/shm", "ronde_test");
  ~ShmDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The host backends the collectives run on: shared memory with a small
// chunk (so that tests cross it) whole and split, and Gloo.
struct Backend {
  std::string name;
  std::map<std::string, std::string> env;
  std::string host_backend;
};

// gtest names the parameter in its output by this.
void PrintTo(const Backend& b, std::ostream* os) {
  *os << b.name;
}

const Backend kShm{"shm", {{"RONDE_SHM_CHUNK_BYTES", "4096"}}, "shm"};
const Backend kShmSplit{
    "shm_split",
    {{"RONDE_SHM_CHUNK_BYTES", "4096"}, {"RONDE_SHM_SPLIT_BYTES", "0"}},
    "shm"};
const Backend kGloo{"gloo", {{"RONDE_SHM", "0"}}, "gloo"};

class Collectives : public ::testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  JobSpec job(const std::string& scenario) {
    JobSpec s = spec(scenario, std::get<1>(GetParam()));
    for (const auto& [k, v] : std::get<0>(GetParam()).env)
      s.env[k] = v;
    s.env["RONDE_SHM_DIR"] = shm_dir_.path;
    return s;
  }
  bool on_shm() const {
    return std::get<0>(GetParam()).host_backend == "shm";
  }
  // A scenario in which the last rank kills itself: a short collective
  // timeout, and the test's own well above it.
  JobResult run_killed_job(const std::string& scenario) {
    JobSpec s = job(scenario);
    s.env["RONDE_TIMEOUT_SECONDS"] = "20";
    s.timeout = std::chrono::seconds(60);
    return run_job(s);
  }
  void TearDown() override {
    EXPECT_TRUE(entries(shm_dir_.path).empty())
        << "left in the shared-memory directory: "
        << (entries(shm_dir_.path).empty() ? "" : entries(shm_dir_.path)[0]);
  }
  ShmDir shm_dir_;
};

TEST_P(Collectives, MatchLocalReference) {
  JobResult r = run_job(job("collectives"));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
  for (const auto& rank : r.ranks) {
    EXPECT_TRUE(contains(
        rank.output, "HOST_BACKEND: " + std::get<0>(GetParam()).host_backend))
        << r.dump();
  }
}

TEST_P(Collectives, MismatchFailsOnEveryRankAndRecovers) {
  JobResult r = run_job(job("mismatch"));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
  for (const auto& rank : r.ranks) {
    EXPECT_TRUE(contains(rank.output, "ERROR_SEEN: ronde: ranks disagree"))
        << r.dump();
  }
}

TEST_P(Collectives, KilledPeerFailsOthersWithinTimeout) {
  JobResult r = run_killed_job("kill_peer");
  ASSERT_FALSE(r.timed_out) << r.dump();
  const int n = std::get<1>(GetParam());
  int named_dead = 0;
  for (const auto& rank : r.ranks) {
    if (rank.rank == n - 1) {
      EXPECT_EQ(rank.signal, SIGKILL) << r.dump();
      continue;
    }
    EXPECT_EQ(rank.exit_code, 3) << r.dump();
    EXPECT_TRUE(contains(
        rank.output,
        "COMM_ERROR: ronde: allreduce of 'big' failed on rank " +
            std::to_string(rank.rank)))
        << r.dump();
    // Every survivor names someone it could not hear from. (A survivor whose
    // failure notice arrives after rank 0, which hosts the store, has exited
    // may name rank 0 instead of the dead rank: suspects are a hint.)
    const std::string suspects = suspects_of(rank.output);
    EXPECT_NE(suspects, "none") << r.dump();
    EXPECT_FALSE(suspects.empty()) << r.dump();
    if (contains(suspects, std::to_string(n - 1)))
      ++named_dead;
    EXPECT_TRUE(contains(rank.output, "LATER: ronde:")) << r.dump();
  }
  EXPECT_GE(named_dead, 1) << "no survivor named the killed rank\n" << r.dump();
  // Well within the collective timeout: the failure is detected, not waited
  // out. Shared memory notices the death itself (the owner's lock goes with
  // the process); what remains is the wait for the survivors' notices.
  EXPECT_LT(r.seconds, on_shm() ? 15.0 : 50.0) << r.dump();
}

// Sums are the same bits on every rank, and over shared memory the same
// whether each rank reduces the whole tensor or a slice of it.
TEST_P(Collectives, SumsAreBitwiseIdenticalOnEveryRank) {
  JobResult r = run_job(job("digest"));
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  auto digest = [](const std::string& out) {
    auto at = out.find("DIGEST: ");
    return at == std::string::npos ? std::string("none")
                                   : out.substr(at, out.find('\n', at) - at);
  };
  for (const auto& rank : r.ranks)
    EXPECT_EQ(digest(rank.output), digest(r.ranks[0].output)) << r.dump();
  if (on_shm()) {
    JobSpec other = job("digest");
    other.env["RONDE_SHM_SPLIT_BYTES"] =
        std::get<0>(GetParam()).name == "shm" ? "0" : "1000000000";
    JobResult again = run_job(other);
    ASSERT_TRUE(again.all_succeeded()) << again.dump();
    EXPECT_EQ(digest(again.ranks[0].output), digest(r.ranks[0].output))
        << r.dump() << again.dump();
  }
}

// A repeated all-reduce travels with its check over shared memory (one
// step for both), with the bits of the unchecked all-reduce; Gloo carries
// none. The worker counts the calls its timeline marks fused.
TEST_P(Collectives, RepeatedAllreducesRideWithTheirCheck) {
  const std::string dir = ronde::testing::make_temp_dir();
  JobSpec s = job("fused");
  s.env["FUSED_TRACE_DIR"] = dir;
  JobResult r = run_job(s);
  ronde::testing::remove_temp_dir(dir);
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  for (const auto& rank : r.ranks) {
    const auto at = rank.output.find("FUSED_CALLS: ");
    ASSERT_NE(at, std::string::npos) << r.dump();
    const int fused = std::atoi(rank.output.c_str() + at + 13);
    if (on_shm())
      EXPECT_GT(fused, 0) << r.dump();
    else
      EXPECT_EQ(fused, 0) << r.dump();
  }
}

// The engine's buckets, in the shared-memory arena, are read in place after
// their check rather than copied into its step: with the default chunk,
// where a plain tensor of that size rides (shared memory, 2 ranks).
TEST_P(Collectives, ArenaBuffersSkipTheCheckStep) {
  if (!on_shm() || std::get<1>(GetParam()) != 2)
    GTEST_SKIP() << "shared memory at 2 ranks only";
  const std::string dir = ronde::testing::make_temp_dir();
  JobSpec s = job("fused_arena");
  s.env.erase("RONDE_SHM_CHUNK_BYTES");
  s.env["FUSED_TRACE_DIR"] = dir;
  JobResult r = run_job(s);
  ronde::testing::remove_temp_dir(dir);
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  for (const auto& rank : r.ranks) {
    // The first call of each name is checked in full; the next two ride.
    EXPECT_NE(
        rank.output.find("ARENA_FUSED: 0 PLAIN_FUSED: 2"), std::string::npos)
        << r.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends,
    Collectives,
    ::testing::Combine(
        ::testing::Values(kShm, kShmSplit, kGloo), ::testing::Values(2, 3, 4)),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_" +
             std::to_string(std::get<1>(info.param));
    });

// Two halves of the job run every collective at once, each on its own
// set (of one rank at 2 and 3 ranks), then overlapping sets one after the
// other, and the error cases (worker_process_sets.cpp, process_sets).
class ProcessSets : public Collectives {};

TEST_P(ProcessSets, EveryCollectiveOnDisjointAndOverlappingSets) {
  JobResult r = run_job(job("process_sets"));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
  for (const auto& rank : r.ranks) {
    EXPECT_TRUE(contains(rank.output, "ERROR_SEEN: ronde: add_process_set"))
        << r.dump();
  }
}

TEST_P(ProcessSets, DeadMemberFailsTheSetWithCommError) {
  JobResult r = run_killed_job("kill_in_set");
  ASSERT_FALSE(r.timed_out) << r.dump();
  const int n = std::get<1>(GetParam());
  for (const auto& rank : r.ranks) {
    if (rank.rank == n - 1) {
      EXPECT_EQ(rank.signal, SIGKILL) << r.dump();
      continue;
    }
    EXPECT_EQ(rank.exit_code, 3) << r.dump();
    if (rank.rank == 0)
      continue;  // outside the set: its barrier failed
    EXPECT_TRUE(contains(
        rank.output,
        "COMM_ERROR: ronde: allreduce of 'in_set' failed on rank " +
            std::to_string(rank.rank)))
        << r.dump();
    EXPECT_TRUE(contains(rank.output, "process set 1 [")) << r.dump();
    const std::string suspects = suspects_of(rank.output);
    EXPECT_NE(suspects, "none") << r.dump();
    EXPECT_FALSE(contains(suspects, " 0")) << "rank 0 is not in the set\n"
                                           << r.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends,
    ProcessSets,
    ::testing::Values(
        std::tuple{kShm, 2},
        std::tuple{kShm, 3},
        std::tuple{kShm, 4},
        std::tuple{kGloo, 4}),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_" +
             std::to_string(std::get<1>(info.param));
    });

// A job whose shared memory cannot be set up runs over Gloo, and rank 0
// says so in one line.
TEST(SharedMemory, UnusableDirectoryFallsBackToGlooWithOneWarning) {
  JobSpec s = spec("collectives", 3);
  s.env["RONDE_SHM_DIR"] = "/nonexistent/ronde";
  JobResult r = run_job(s);
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  for (const auto& rank : r.ranks) {
    EXPECT_TRUE(contains(rank.output, "HOST_BACKEND: gloo")) << r.dump();
    const bool warned = contains(
        rank.output,
        "warning: shared memory is unavailable (rank 0: cannot "
        "create /nonexistent/ronde/ronde-");
    EXPECT_EQ(warned, rank.rank == 0) << r.dump();
  }
}

// Two jobs at once on one host, in one directory: each maps only its own
// segments (a random part per job names them) and both compute right.
TEST(SharedMemory, TwoJobsOnOneHostKeepApart) {
  ShmDir dir;
  ASSERT_FALSE(dir.path.empty());
  JobSpec a = spec("collectives", 2);
  JobSpec b = spec("collectives", 3);
  a.env["RONDE_SHM_DIR"] = b.env["RONDE_SHM_DIR"] = dir.path;
  RunningJob first(a);
  RunningJob second(b);
  JobResult ra = first.wait();
  JobResult rb = second.wait();
  EXPECT_TRUE(ra.all_succeeded()) << ra.dump();
  EXPECT_TRUE(rb.all_succeeded()) << rb.dump();
  for (const auto* r : {&ra, &rb}) {
    for (const auto& rank : r->ranks)
      EXPECT_TRUE(contains(rank.output, "HOST_BACKEND: shm")) << r->dump();
  }
  EXPECT_TRUE(entries(dir.path).empty());
}

// A segment left behind by a job killed during init() (no live owner) is
// removed by the next job on the host; a live job's is not touched.
TEST(SharedMemory, NextJobRemovesSegmentsOfDeadJobs) {
  ShmDir dir;
  ASSERT_FALSE(dir.path.empty());
  {
    std::ofstream(dir.path + "/ronde-0123456789abcdef0123456789abcdef-1")
        << "x";
  }
  JobSpec s = spec("collectives", 2);
  s.env["RONDE_SHM_DIR"] = dir.path;
  JobResult r = run_job(s);
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  EXPECT_TRUE(entries(dir.path).empty());
}

TEST(C10dBackend, ProcessGroupFromCxxStartsRondeAndRunsItsCollectives) {
  JobResult r = run_job(spec("c10d_process_group", 3));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

// A one-rank job's checked all-reduce is done in its check: the same
// results as the unchecked call and the reference, no exchange.
TEST(Collectives, OneRankAllreduceRidesItsCheck) {
  const std::string dir = ronde::testing::make_temp_dir();
  JobSpec s = spec("fused", 1);
  s.env["FUSED_TRACE_DIR"] = dir;
  JobResult r = run_job(s);
  ronde::testing::remove_temp_dir(dir);
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  const auto at = r.ranks[0].output.find("FUSED_CALLS: ");
  ASSERT_NE(at, std::string::npos) << r.dump();
  EXPECT_GT(std::atoi(r.ranks[0].output.c_str() + at + 13), 0) << r.dump();
}

TEST(Collectives, GradientsFollowHorovodsBackwardRules) {
  // Three ranks: averages, roots and blocks that two ranks would hide.
  JobResult r = run_job(spec("gradients", 3));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST(Collectives, SingleProcessNeedsNoLauncher) {
  // No launcher variables at all: world size 1, no network, same results.
  JobSpec s = spec("collectives", 1);
  for (const char* v :
       {"RONDE_RANK",
        "RONDE_SIZE",
        "RONDE_LOCAL_RANK",
        "RONDE_LOCAL_SIZE",
        "RONDE_RENDEZVOUS_ADDR",
        "RONDE_RENDEZVOUS_PORT",
        "RONDE_JOB_ID"}) {
    s.env[v] = "";
  }
  JobResult r = run_job(s);
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST(Rendezvous, ForeignJobIsRefusedAndJobContinues) {
  std::string dir = ronde::testing::make_temp_dir();
  JobSpec s = spec("hold", 2);
  s.argv.push_back(dir);
  RunningJob job(s);
  struct stat st {};
  for (int i = 0; i < 600 && ::stat((dir + "/ready").c_str(), &st) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(::stat((dir + "/ready").c_str(), &st), 0) << job.wait().dump();

  // Another job's rank 1 finds this job's store.
  JobSpec foreign = spec("intruder", 2);
  foreign.port = job.spec().port;
  foreign.job_id = "someone-else";
  foreign.only_ranks = {1};
  foreign.env["RONDE_TIMEOUT_SECONDS"] = "10";
  JobResult fr = run_job(foreign);
  ASSERT_EQ(fr.ranks.size(), 1u);
  EXPECT_EQ(fr.ranks[0].exit_code, 4) << fr.dump();
  EXPECT_TRUE(contains(fr.ranks[0].output, "refused")) << fr.dump();
  EXPECT_TRUE(contains(fr.ranks[0].output, "someone-else")) << fr.dump();

  // Same job id, different world size.
  JobSpec bigger = spec("intruder", 3);
  bigger.port = job.spec().port;
  bigger.job_id = job.spec().job_id;
  bigger.only_ranks = {2};
  bigger.env["RONDE_TIMEOUT_SECONDS"] = "10";
  JobResult br = run_job(bigger);
  EXPECT_EQ(br.ranks[0].exit_code, 4) << br.dump();
  EXPECT_TRUE(contains(br.ranks[0].output, "of 2 ranks")) << br.dump();

  // A duplicate rank of the same job is refused too.
  JobSpec dup = spec("intruder", 2);
  dup.port = job.spec().port;
  dup.job_id = job.spec().job_id;
  dup.only_ranks = {1};
  dup.env["RONDE_TIMEOUT_SECONDS"] = "10";
  JobResult dr = run_job(dup);
  EXPECT_EQ(dr.ranks[0].exit_code, 4) << dr.dump();
  EXPECT_TRUE(contains(dr.ranks[0].output, "claimed by another process"))
      << dr.dump();

  std::ofstream(dir + "/go").put('\n');
  JobResult jr = job.wait();
  EXPECT_TRUE(jr.all_succeeded()) << jr.dump();
}

TEST(Rendezvous, MissingPeerTimesOutWithClearError) {
  // Rank 1 of 2 never starts: rank 0 must give up within its timeout.
  JobSpec s = spec("init_error", 2);
  s.only_ranks = {0};
  s.env["RONDE_TIMEOUT_SECONDS"] = "3";
  s.timeout = std::chrono::seconds(60);
  JobResult r = run_job(s);
  ASSERT_FALSE(r.timed_out) << r.dump();
  EXPECT_EQ(r.ranks[0].exit_code, 5) << r.dump();
  EXPECT_TRUE(contains(r.ranks[0].output, "INIT_ERROR: ronde:")) << r.dump();
}

TEST(Rendezvous, StoreWithoutLibuv) {
  // USE_LIBUV=0, as in PyTorch: rank 0 serves the store from the older
  // thread-based server, and a whole job runs on it.
  JobSpec s = spec("collectives", 3);
  s.env["USE_LIBUV"] = "0";
  JobResult r = run_job(s);
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

// The harness itself: a rank that crashes writes its signal and stack to
// its log, and its peer is stopped after JobSpec::crash_grace instead of
// finishing (it would sleep for a minute and exit 0).
TEST(Harness, CrashedRankReportsItsStackAndItsPeerIsStopped) {
  JobSpec s = spec("crash", 2);
  s.crash_grace = std::chrono::seconds(2);
  s.timeout = std::chrono::seconds(120);
  JobResult r = run_job(s);
  ASSERT_EQ(r.ranks.size(), 2u) << r.dump();
  EXPECT_EQ(r.ranks[1].signal, SIGABRT) << r.dump();
  EXPECT_TRUE(contains(r.ranks[1].output, "*** crash report: SIGABRT, stack:"))
      << r.dump();
  EXPECT_EQ(r.ranks[0].signal, SIGKILL) << r.dump();
}

#ifdef RONDE_TEST_WORKER_TORCH_FIRST
// The executables below differ only in link order (see tests/CMakeLists.txt).
// LibTorch linked first, as users do: every collective still runs on the
// system Gloo, isolated from LibTorch's exported copy.
TEST(GlooIsolation, TorchFirstExecutablePasses) {
  JobResult r = run_job(spec("collectives", 2, RONDE_TEST_WORKER_TORCH_FIRST));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST(GlooIsolation, GlooFirstExecutablePasses) {
  JobResult r = run_job(spec("collectives", 2, RONDE_TEST_WORKER_GLOO_FIRST));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

void expect_clean_refusal(const JobResult& r, const std::string& needle) {
  ASSERT_FALSE(r.timed_out) << r.dump();
  for (const auto& rank : r.ranks) {
    EXPECT_EQ(rank.signal, 0) << "crashed instead of refusing\n" << r.dump();
    EXPECT_EQ(rank.exit_code, 5) << r.dump();
    EXPECT_TRUE(contains(rank.output, "INIT_ERROR: ronde:")) << r.dump();
  }
  bool named = false;
  for (const auto& rank : r.ranks)
    named |= contains(rank.output, needle);
  EXPECT_TRUE(named) << r.dump();
}

// Linked with -static-libstdc++: without ronde's --exclude-libs its copy of
// the C++ runtime is exported, the Gloo module (bound to the system's) sees
// another copy than the process, and ronde refuses to load it (without that
// check: an abort in free() when Gloo tears a std::locale down).
TEST(GlooIsolation, StaticCxxRuntimeExecutablePasses) {
  JobResult r = run_job(spec("collectives", 2, RONDE_TEST_WORKER_STATIC_CXX));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

// An executable that loads libgloo itself after LibTorch has a broken libgloo
// before ronde starts: ronde must say so rather than crash.
TEST(GlooIsolation, TorchThenGlooExecutableIsRefusedClearly) {
  JobSpec s = spec("init_error", 2, RONDE_TEST_WORKER_TORCH_THEN_GLOO);
  s.env["RONDE_TIMEOUT_SECONDS"] = "10";
  expect_clean_refusal(run_job(s), "loaded the system libgloo after LibTorch");
}

// Without RTLD_DEEPBIND the module's Gloo calls would bind to LibTorch's
// copy: the start-up check must refuse instead of crashing.
TEST(GlooIsolation, WithoutDeepbindTheWrongGlooIsDetected) {
  JobSpec s = spec("init_error", 2, RONDE_TEST_WORKER_TORCH_FIRST);
  s.env["RONDE_GLOO_DEEPBIND"] = "0";
  s.env["RONDE_TIMEOUT_SECONDS"] = "10";
  expect_clean_refusal(run_job(s), "LibTorch's private Gloo");
}
#endif

}  // namespace
