// ronderun's elastic options and growth decisions: --min-np and what it
// gives the ranks, the options of growth and their refusals, a joining
// rank's environment, the discovery script's output, and where new ranks
// go.
#include "growth.h"
#include "options.h"
#include "rank_env.h"
#include "ronderun_args.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

namespace ronde::detail {
namespace {

using Strings = std::vector<std::string>;

TEST(RonderunElastic, ReadsTheElasticOptions) {
  Options o;
  ASSERT_EQ(
      parse(
          {"-np",
           "2",
           "--min-np",
           "1",
           "--max-np",
           "4",
           "--host-discovery-script",
           "./hosts.sh",
           "--restart-failed",
           "cmd"},
          o),
      "");
  EXPECT_EQ(o.min_ranks, 1);
  EXPECT_EQ(o.max_ranks, 4);
  EXPECT_EQ(o.discovery_script, "./hosts.sh");
  EXPECT_TRUE(o.restart_failed);
}

TEST(RonderunElastic, RefusesGrowthWithoutAnElasticJob) {
  Options a, b, c, d;
  EXPECT_EQ(
      parse({"-np", "2", "--restart-failed", "cmd"}, a),
      "--max-np, --host-discovery-script and --restart-failed are for "
      "elastic jobs: give --min-np too");
  EXPECT_EQ(
      parse(
          {"-np", "2", "--min-np", "1", "--host-discovery-script", "s", "cmd"},
          b),
      "--host-discovery-script needs --max-np (how far the job may grow)");
  EXPECT_EQ(
      parse({"-np", "3", "--min-np", "1", "--max-np", "2", "cmd"}, c),
      "--max-np 2 is fewer than the job's 3 ranks");
  EXPECT_EQ(
      parse({"-np", "2", "--min-np", "3", "cmd"}, d),
      "--min-np 3 is more than the job's 2 ranks");
}

TEST(RonderunElastic, TellsTheRanksTheStoreIsHostedAndTheMinimum) {
  Options o;
  ASSERT_EQ(
      parse({"-np", "2", "--min-np", "1", "--port", "29500", "cmd"}, o), "");
  const std::vector<RankLaunch> l = rank_launches(o, {}, JobContext{});
  const Strings& env = l[1].env;
  EXPECT_NE(
      std::find(env.begin(), env.end(), "RONDE_STORE_HOSTED=1"), env.end());
  EXPECT_NE(
      std::find(env.begin(), env.end(), "RONDE_ELASTIC_MIN_NP=1"), env.end());
}

TEST(RonderunElastic, AJoiningRankIsAWorldOfOneWithItsMemberId) {
  Options o;
  ASSERT_EQ(
      parse(
          {"-np",
           "2",
           "--min-np",
           "1",
           "--port",
           "29500",
           "--job-id",
           "j",
           "cmd"},
          o),
      "");
  JobContext job;
  job.secret_file = "/s/secret";
  const RankLaunch l =
      joiner_launch(o, {"HOME=/h", "RONDE_ELASTIC_JOIN=9"}, job, "", 5);
  EXPECT_TRUE(l.argv.empty());
  EXPECT_EQ(
      l.env,
      (Strings{
          "HOME=/h",
          "RONDE_RANK=0",
          "RONDE_SIZE=1",
          "RONDE_LOCAL_RANK=0",
          "RONDE_LOCAL_SIZE=1",
          "RONDE_CROSS_RANK=0",
          "RONDE_CROSS_SIZE=1",
          "RONDE_RENDEZVOUS_ADDR=127.0.0.1",
          "RONDE_RENDEZVOUS_PORT=29500",
          "RONDE_JOB_ID=j",
          "RONDE_JOB_SECRET_FILE=/s/secret",
          "RONDE_BIND_TO=core",
          "RONDE_STORE_HOSTED=1",
          "RONDE_ELASTIC_MIN_NP=1",
          "RONDE_ELASTIC_JOIN=5"}));
  const RankLaunch remote = joiner_launch(o, {}, job, "node7", 6);
  ASSERT_FALSE(remote.argv.empty());
  EXPECT_EQ(remote.host, "node7");
}

TEST(RonderunElastic, ReadsTheDiscoveryScriptsOutput) {
  std::vector<HostSlots> hosts;
  EXPECT_EQ(parse_discovery("a:2\n\n# comment\n  b:1  \nc\n", hosts), "");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "a");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].host, "b");
  EXPECT_EQ(hosts[2].slots, 1);
  std::vector<HostSlots> bad;
  EXPECT_NE(parse_discovery("a:x\n", bad), "");
}

TEST(RonderunElastic, PlacesNewRanksOnFreeSlotsWithinTheMaximum) {
  const std::vector<HostSlots> found = {{"localhost", 3}, {"b", 2}, {"c", 2}};
  // Two run here (counted under ""), one on b; c is blacklisted.
  EXPECT_EQ(
      plan_growth(found, {{"", 2}, {"b", 1}}, 5, {"c"}),
      (Strings{"localhost", "b"}));
  EXPECT_EQ(plan_growth(found, {{"", 2}, {"b", 1}}, 3, {}), Strings{});
  EXPECT_EQ(plan_growth(found, {{"", 3}}, 6, {}), (Strings{"b", "b", "c"}));
}

TEST(RonderunElastic, RunsTheDiscoveryScript) {
  std::string out;
  EXPECT_EQ(run_discovery("echo localhost:4", out), "");
  EXPECT_EQ(out, "localhost:4\n");
  EXPECT_NE(run_discovery("exit 3", out), "");
}

}  // namespace
}  // namespace ronde::detail
