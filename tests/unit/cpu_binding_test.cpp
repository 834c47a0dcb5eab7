// The CPU share of each rank of a host (runtime/cpu_binding.h), and that a
// bound process really runs there.
#include "runtime/cpu_binding.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <thread>

namespace ronde::detail {
namespace {

TEST(CpuBinding, CoreCutsTheAllowedCpusIntoDisjointShares) {
  const std::vector<int> allowed = {0, 1, 2, 3, 4, 5, 6, 8};
  const std::vector<int> pkg(allowed.size(), 0);
  std::string why;
  EXPECT_EQ(
      cpus_for_rank("core", allowed, pkg, 0, 3, why), (std::vector<int>{0, 1}));
  EXPECT_EQ(
      cpus_for_rank("core", allowed, pkg, 2, 3, why), (std::vector<int>{4, 5}));
  EXPECT_EQ(
      cpus_for_rank("core", allowed, pkg, 1, 2, why),
      (std::vector<int>{4, 5, 6, 8}));
  EXPECT_TRUE(why.empty());
}

TEST(CpuBinding, MoreRanksThanCpusBindNothingAndSayWhy) {
  std::string why;
  EXPECT_TRUE(cpus_for_rank("core", {0, 1}, {0, 0}, 2, 3, why).empty());
  EXPECT_NE(why.find("3 ranks on this host, 2 CPUs"), std::string::npos);
}

TEST(CpuBinding, SocketGivesEveryCpuOfOneSocketInTurn) {
  const std::vector<int> allowed = {0, 1, 2, 3};
  const std::vector<int> pkg = {0, 1, 0, 1};
  std::string why;
  EXPECT_EQ(
      cpus_for_rank("socket", allowed, pkg, 0, 4, why),
      (std::vector<int>{0, 2}));
  EXPECT_EQ(
      cpus_for_rank("socket", allowed, pkg, 3, 4, why),
      (std::vector<int>{1, 3}));
}

TEST(CpuBinding, NoneBindsNothingAndAnUnknownModeIsNamed) {
  std::string why;
  EXPECT_TRUE(cpus_for_rank("none", {0, 1}, {0, 0}, 0, 1, why).empty());
  EXPECT_TRUE(why.empty());
  EXPECT_TRUE(cpus_for_rank("numa", {0, 1}, {0, 0}, 0, 1, why).empty());
  EXPECT_NE(why.find("'numa'"), std::string::npos);
}

TEST(CpuBinding, ABoundProcessAndItsNewThreadsRunOnTheirShare) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  if (CPU_COUNT(&before) < 2)
    GTEST_SKIP() << "one CPU allowed";
  // The last of two shares: CPUs the process may not have run on before.
  ASSERT_EQ(bind_process("core", 1, 2), "");
  cpu_set_t now;
  ASSERT_EQ(sched_getaffinity(0, sizeof(now), &now), 0);
  EXPECT_EQ(CPU_COUNT(&now), CPU_COUNT(&before) / 2);
  int cpu = -1;
  std::thread([&] { cpu = sched_getcpu(); }).join();
  EXPECT_TRUE(CPU_ISSET(cpu, &now)) << "a new thread ran on CPU " << cpu;
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
}

}  // namespace
}  // namespace ronde::detail
