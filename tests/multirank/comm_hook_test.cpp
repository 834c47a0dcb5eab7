// Communication hooks across real processes: the built-in all-reduce and
// 16-bit hooks equal hand-made collectives bit for bit, PowerSGD keeps
// every replica bitwise equal at 2, 3 and 4 ranks and matches a reference
// written in plain tensor operations, a checkpointed run resumes exactly,
// ranks that join early answer its collectives, and the example's own hook
// works as a user would write it.
#include "harness.h"

#include <gtest/gtest.h>

#include <tuple>

using ronde::testing::JobResult;
using ronde::testing::run_job;
using ronde::testing::worker_spec;

namespace {

using Case = std::tuple<std::string, int>;

class CommHooks : public ::testing::TestWithParam<Case> {};

TEST_P(CommHooks, HoldOnEveryRank) {
  auto [scenario, np] = GetParam();
  JobResult r = run_job(worker_spec({scenario}, np));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios,
    CommHooks,
    ::testing::Values(
        Case{"hook_builtins", 2},
        Case{"hook_builtins", 3},
        Case{"hook_cast_steps", 2},
        Case{"hook_cast_steps", 3},
        Case{"powersgd_train", 2},
        Case{"powersgd_train", 3},
        Case{"powersgd_train", 4},
        Case{"powersgd_reference", 2},
        Case{"powersgd_reference", 3},
        Case{"powersgd_join", 2},
        Case{"powersgd_join", 3},
        Case{"user_hook", 2}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::get<0>(info.param) + "_np" +
             std::to_string(std::get<1>(info.param));
    });

TEST(CommHooks, PowerSGDResumesExactlyFromACheckpoint) {
  const std::string dir = ronde::testing::make_temp_dir();
  JobResult r = run_job(worker_spec({"powersgd_resume", dir}, 2));
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
  ronde::testing::remove_temp_dir(dir);
}

}  // namespace
