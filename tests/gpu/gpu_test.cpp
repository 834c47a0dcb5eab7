// The GPU suite: gpu_worker as real processes on one machine with a CUDA
// device. NCCL refuses two ranks on one GPU, so NCCL runs at world size 1
// (the whole path: routing, its stream, events, watchdog) and two ranks run
// Gloo on CUDA tensors on the same GPU. Every test skips on a machine
// without a CUDA device. tests/gpu/run_gpu_checks.sh builds and runs it.
#include "harness.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>

using ronde::testing::JobResult;
using ronde::testing::JobSpec;
using ronde::testing::run_job;

namespace {

JobSpec gpu_spec(
    std::vector<std::string> args, int np, const std::string& backend) {
  JobSpec spec =
      ronde::testing::worker_spec(std::move(args), np, RONDE_GPU_WORKER);
  spec.env["RONDE_CUDA_BACKEND"] = backend;
  // A stuck collective ends in ronde's own error (60 s) well before the
  // harness kills the job, so a hang reports what hung.
  spec.env["RONDE_TIMEOUT_SECONDS"] = "60";
  spec.timeout = std::chrono::seconds(150);
  // A rank that crashed leaves its peer waiting for it: stop the job.
  spec.crash_grace = std::chrono::seconds(10);
  return spec;
}

bool have_gpu() {
  static const bool yes = [] {
    JobResult r = run_job(gpu_spec({"probe"}, 1, "gloo"));
    return r.ranks.size() == 1 && r.ranks[0].exit_code == 0;
  }();
  return yes;
}

#define REQUIRE_GPU()                        \
  do {                                       \
    if (!have_gpu())                         \
      GTEST_SKIP() << "no CUDA device here"; \
  } while (0)

// NCCL at one rank, Gloo at two.
using Backend = std::tuple<std::string, int>;
std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return std::get<0>(info.param) + "_np" +
         std::to_string(std::get<1>(info.param));
}
const auto kBackends =
    ::testing::Values(Backend{"nccl", 1}, Backend{"gloo", 2});

class GpuCollectives : public ::testing::TestWithParam<Backend> {};

TEST_P(GpuCollectives, EveryDtypeAndOpMatchesTheReference) {
  REQUIRE_GPU();
  auto [backend, np] = GetParam();
  JobResult r = run_job(gpu_spec({"collectives"}, np, backend));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST_P(GpuCollectives, OrderedAfterTheProducerWithoutHoldingTheHost) {
  REQUIRE_GPU();
  auto [backend, np] = GetParam();
  JobResult r = run_job(gpu_spec({"stream_order"}, np, backend));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuCollectives, kBackends, backend_name);

using OptimCase = std::tuple<std::string, int, std::string, std::string>;
class GpuOptimizer : public ::testing::TestWithParam<OptimCase> {};

TEST_P(GpuOptimizer, MatchesOneProcessOnTheGlobalBatch) {
  REQUIRE_GPU();
  auto [backend, np, opt, variant] = GetParam();
  JobResult r = run_job(gpu_spec({"optim", opt, variant}, np, backend));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

std::string optim_name(const ::testing::TestParamInfo<OptimCase>& info) {
  return std::get<0>(info.param) + "_np" +
         std::to_string(std::get<1>(info.param)) + "_" +
         std::get<2>(info.param) + "_" + std::get<3>(info.param);
}

INSTANTIATE_TEST_SUITE_P(
    Nccl,
    GpuOptimizer,
    ::testing::Combine(
        ::testing::Values("nccl"),
        ::testing::Values(1),
        ::testing::Values("sgd", "adam"),
        ::testing::Values("plain", "bpps2", "unused", "copy", "smallbuckets")),
    optim_name);
INSTANTIATE_TEST_SUITE_P(
    Gloo,
    GpuOptimizer,
    ::testing::Combine(
        ::testing::Values("gloo"),
        ::testing::Values(2),
        ::testing::Values("sgd", "adam"),
        ::testing::Values("plain", "unused", "copy")),
    optim_name);
INSTANTIATE_TEST_SUITE_P(
    Compression,
    GpuOptimizer,
    ::testing::Values(
        OptimCase{"nccl", 1, "sgd", "fp16"},
        OptimCase{"gloo", 2, "sgd", "fp16"}),
    optim_name);

using AmpCase = std::tuple<std::string, int, std::string>;
class GpuAmp : public ::testing::TestWithParam<AmpCase> {};

TEST_P(GpuAmp, AutocastAndGradScalerSkipTogetherAndLearn) {
  REQUIRE_GPU();
  auto [backend, np, kind] = GetParam();
  JobResult r = run_job(gpu_spec({"amp", kind}, np, backend));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Kinds,
    GpuAmp,
    ::testing::Values(
        AmpCase{"nccl", 1, "fp16"},
        AmpCase{"nccl", 1, "bf16"},
        AmpCase{"gloo", 2, "fp16"},
        AmpCase{"gloo", 2, "bf16"}),
    [](const ::testing::TestParamInfo<AmpCase>& info) {
      return std::get<0>(info.param) + "_np" +
             std::to_string(std::get<1>(info.param)) + "_" +
             std::get<2>(info.param);
    });

class GpuTimeout : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuTimeout, AbortsTheNcclCommunicatorAndRaises) {
  REQUIRE_GPU();
  JobSpec spec = gpu_spec({"timeout"}, 1, "nccl");
  spec.env["RONDE_TIMEOUT_SECONDS"] = "2";
  spec.env["RONDE_BLOCKING_WAIT"] = GetParam() == "blocking" ? "1" : "0";
  JobResult r = run_job(spec);
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
  EXPECT_NE(
      r.ranks[0].output.find("aborting the NCCL communicator"),
      std::string::npos)
      << r.dump();
}

INSTANTIATE_TEST_SUITE_P(
    WaitModes, GpuTimeout, ::testing::Values("blocking", "ordered"));

TEST(GpuCheckpoint, RestoresTheDeviceGenerator) {
  REQUIRE_GPU();
  JobResult r = run_job(
      gpu_spec({"checkpoint_rng", ronde::testing::make_temp_dir()}, 1, "nccl"));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

}  // namespace
