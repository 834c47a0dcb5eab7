// Launcher environment parsing: each convention, precedence, and bad values.
#include "runtime/launch_env.h"
#include "fake_env.h"
#include "runtime/settings.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <map>

using ronde::detail::LaunchInfo;
using ronde::detail::parse_launch_env;

namespace {

LaunchInfo parse(const std::map<std::string, std::string>& vars) {
  return parse_launch_env(ronde::testing::fake_env(vars));
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(LaunchEnv, NothingSetIsOneProcess) {
  LaunchInfo info = parse({});
  EXPECT_EQ(info.source, "none");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.size, 1);
  EXPECT_EQ(info.local_size, 1);
  EXPECT_EQ(info.cross_size, 1);
}

TEST(LaunchEnv, Ronderun) {
  LaunchInfo info = parse(
      {{"RONDE_RANK", "3"},
       {"RONDE_SIZE", "8"},
       {"RONDE_LOCAL_RANK", "1"},
       {"RONDE_LOCAL_SIZE", "2"},
       {"RONDE_RENDEZVOUS_ADDR", "10.0.0.1"},
       {"RONDE_RENDEZVOUS_PORT", "29400"},
       {"RONDE_JOB_ID", "j1"}});
  EXPECT_EQ(info.source, "ronde");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 2);
  EXPECT_EQ(info.cross_rank, 1);
  EXPECT_EQ(info.cross_size, 4);
  EXPECT_EQ(info.addr, "10.0.0.1");
  EXPECT_EQ(info.port, 29400);
  EXPECT_EQ(info.job_id, "j1");
}

TEST(LaunchEnv, RondeWinsOverTorchrun) {
  LaunchInfo info = parse(
      {{"RONDE_RANK", "0"},
       {"RONDE_SIZE", "1"},
       {"RANK", "5"},
       {"WORLD_SIZE", "6"}});
  EXPECT_EQ(info.source, "ronde");
  EXPECT_EQ(info.size, 1);
}

TEST(LaunchEnv, Torchrun) {
  LaunchInfo info = parse(
      {{"RANK", "5"},
       {"WORLD_SIZE", "8"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"GROUP_RANK", "1"},
       {"MASTER_ADDR", "host0"},
       {"MASTER_PORT", "29500"},
       {"TORCHELASTIC_RUN_ID", "run7"}});
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.cross_rank, 1);
  EXPECT_EQ(info.cross_size, 2);
  EXPECT_EQ(info.addr, "host0");
  EXPECT_EQ(info.port, 29500);
  EXPECT_EQ(info.job_id, "run7");
  EXPECT_FALSE(info.store_hosted);
}

TEST(LaunchEnv, TorchrunAgentStore) {
  LaunchInfo info = parse(
      {{"RANK", "0"},
       {"WORLD_SIZE", "2"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", "29500"},
       {"TORCHELASTIC_RUN_ID", "run7"},
       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
       {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_TRUE(info.store_hosted);
  EXPECT_EQ(info.job_id, "run7.restart2");
}

TEST(LaunchEnv, Slurm) {
  LaunchInfo info = parse(
      {{"SLURM_PROCID", "6"},
       {"SLURM_NTASKS", "8"},
       {"SLURM_LOCALID", "2"},
       {"SLURM_NTASKS_PER_NODE", "4(x2)"},
       {"SLURM_NODEID", "1"},
       {"SLURM_NNODES", "2"},
       {"SLURM_JOB_ID", "123"},
       {"SLURM_STEP_ID", "0"},
       {"MASTER_ADDR", "node0"},
       {"MASTER_PORT", "1234"}});
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.cross_rank, 1);
  EXPECT_EQ(info.cross_size, 2);
  EXPECT_EQ(info.job_id, "slurm-123.0");
}

TEST(LaunchEnv, OpenMpi) {
  LaunchInfo info = parse(
      {{"OMPI_COMM_WORLD_RANK", "3"},
       {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
       {"RONDE_RENDEZVOUS_ADDR", "h"},
       {"RONDE_RENDEZVOUS_PORT", "5000"}});
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.cross_rank, 1);
  EXPECT_EQ(info.cross_size, 2);
}

TEST(LaunchEnv, SingleRankNeedsNoAddress) {
  LaunchInfo info = parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(info.size, 1);
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  EXPECT_NE(
      error_of({{"RONDE_RANK", "2"},
                {"RONDE_SIZE", "2"},
                {"RONDE_RENDEZVOUS_ADDR", "a"},
                {"RONDE_RENDEZVOUS_PORT", "1"}})
          .find("RONDE_RANK=2 must be smaller than RONDE_SIZE=2"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RONDE_RANK", "-1"}, {"RONDE_SIZE", "2"}})
          .find("RONDE_RANK=-1 is out of range"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}})
          .find("RANK='x1' is not an integer"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "1"}, {"WORLD_SIZE", "2 "}})
          .find("WORLD_SIZE='2 ' is not an integer"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}})
          .find("has no rendezvous address"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})
          .find("has no rendezvous port"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "1"},
                {"WORLD_SIZE", "2"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT=70000 is out of range"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RONDE_RANK", "1"}}).find("RONDE_SIZE is not set"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"SLURM_PROCID", "0"}}).find("SLURM_NTASKS is not set"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RONDE_RANK", "0"},
                {"RONDE_SIZE", "2"},
                {"RONDE_LOCAL_RANK", "3"},
                {"RONDE_LOCAL_SIZE", "2"},
                {"RONDE_RENDEZVOUS_ADDR", "a"},
                {"RONDE_RENDEZVOUS_PORT", "1"}})
          .find("local rank 3 must be smaller than the local size 2"),
      std::string::npos);
}

}  // namespace

namespace {

TEST(LaunchEnv, PositiveEnvNumbers) {
  std::map<std::string, std::string> vars;
  auto knob = [&] {
    return ronde::detail::positive_env_number(
        ronde::testing::fake_env(vars), "RONDE_TEST_KNOB", "seconds");
  };
  EXPECT_FALSE(knob().has_value());
  vars["RONDE_TEST_KNOB"] = "2.5";
  EXPECT_DOUBLE_EQ(*knob(), 2.5);
  for (const char* bad : {"0", "-1", "ten", "3s"}) {
    vars["RONDE_TEST_KNOB"] = bad;
    try {
      knob();
      ADD_FAILURE() << "accepted " << bad;
    } catch (const c10::Error& e) {
      EXPECT_NE(
          std::string(e.what_without_backtrace())
              .find(
                  "RONDE_TEST_KNOB='" + std::string(bad) +
                  "' is not a positive number of seconds"),
          std::string::npos);
    }
  }
}

}  // namespace
