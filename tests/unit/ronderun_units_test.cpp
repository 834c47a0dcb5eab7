// Unit tests of ronderun's units (plugin/tools/ronderun), without starting
// the binary: the command line and each of its refusals, host lists, the
// remote-command template and the ranks' environment. The units that touch
// files and processes are in ronderun_job_units_test.cpp; ronderun_test
// runs the binary.

#include "hosts.h"
#include "options.h"
#include "rank_env.h"
#include "ronderun_args.h"

#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ronde::detail {
namespace {

using Strings = std::vector<std::string>;

std::string parse_error(std::initializer_list<const char*> args) {
  Options options;
  return parse(args, options);
}

Options parsed(std::initializer_list<const char*> args) {
  Options options;
  const std::string error = parse(args, options);
  EXPECT_EQ(error, "");
  return options;
}

// --- options ---------------------------------------------------------------

TEST(RonderunOptions, TakesTheDefaults) {
  const Options o = parsed({"-np", "3", "train", "--lr", "1"});
  EXPECT_EQ(o.num_ranks, 3);
  EXPECT_EQ(o.command, (Strings{"train", "--lr", "1"}));
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_FALSE(o.host_given);
  EXPECT_EQ(o.port, 0);
  EXPECT_EQ(o.rsh, "ssh -o BatchMode=yes {host}");
  EXPECT_TRUE(o.hosts.empty());
  EXPECT_TRUE(o.exports.empty());
  EXPECT_FALSE(o.timeout_seconds.has_value());
  EXPECT_EQ(o.job_id, "");
  EXPECT_EQ(o.timeline_dir, "");
  EXPECT_TRUE(o.prefix);
  EXPECT_FALSE(o.verbose);
  EXPECT_FALSE(o.help);
}

TEST(RonderunOptions, ReadsEveryOption) {
  const Options o =
      parsed({"-n",    "2",          "--timeout", "30",          "--job-id",
              "j1",    "--port",     "29500",     "--host",      "10.0.0.5",
              "--rsh", "sh -c",      "-x",        "A=1",         "-x",
              "B",     "--timeline", "tl",        "--no-prefix", "--verbose",
              "--",    "-cmd",       "x"});
  EXPECT_EQ(o.num_ranks, 2);
  EXPECT_EQ(o.timeout_seconds, 30);
  EXPECT_EQ(o.job_id, "j1");
  EXPECT_EQ(o.port, 29500);
  EXPECT_EQ(o.host, "10.0.0.5");
  EXPECT_TRUE(o.host_given);
  EXPECT_EQ(o.rsh, "sh -c");
  EXPECT_EQ(o.exports, (Strings{"A=1", "B"}));
  EXPECT_EQ(o.timeline_dir, "tl");
  EXPECT_FALSE(o.prefix);
  EXPECT_TRUE(o.verbose);
  EXPECT_EQ(o.command, (Strings{"-cmd", "x"}));
  EXPECT_EQ(parsed({"--np", "4", "cmd"}).num_ranks, 4);
}

TEST(RonderunOptions, HelpStopsParsingButNotAnEarlierError) {
  Options o;
  EXPECT_EQ(parse({"--bogus", "-h"}, o), "unknown option '--bogus'");
  Options help;
  EXPECT_EQ(parse({"-np", "2", "--help", "--bogus"}, help), "");
  EXPECT_TRUE(help.help);
}

TEST(RonderunOptions, HostsGiveTheRankCountOrBoundIt) {
  const Options all = parsed({"-H", "a:2,b:2", "cmd"});
  EXPECT_EQ(all.num_ranks, 4);
  ASSERT_EQ(all.hosts.size(), 2u);
  EXPECT_EQ(all.hosts[1].host, "b");
  EXPECT_EQ(parsed({"-np", "3", "--hosts", "a:2,b:2", "cmd"}).num_ranks, 3);
  EXPECT_EQ(
      parse_error({"-np", "5", "-H", "a:2,b:2", "cmd"}),
      "-np 5 asks for more ranks than the hosts have slots (4)");
}

TEST(RonderunOptions, RefusesEachBadValueWithItsMessage) {
  EXPECT_EQ(parse_error({"--bogus", "cmd"}), "unknown option '--bogus'");
  EXPECT_EQ(parse_error({"-np"}), "option '-np' needs a value");
  EXPECT_EQ(
      parse_error({"-np", "0", "cmd"}),
      "-np expects a positive number of ranks, got '0'");
  EXPECT_EQ(
      parse_error({"-n", "-1", "cmd"}),
      "-n expects a positive number of ranks, got '-1'");
  EXPECT_EQ(
      parse_error({"--np", "3x", "cmd"}),
      "--np expects a positive number of ranks, got '3x'");
  EXPECT_EQ(
      parse_error({"-np", "1", "--timeout", "0", "cmd"}),
      "--timeout expects a positive whole number of seconds, got '0'");
  EXPECT_EQ(
      parse_error({"-np", "1", "--port", "65536", "cmd"}),
      "--port expects a port number in 1..65535, got '65536'");
  EXPECT_EQ(
      parse_error({"-np", "1", "--job-id", "", "cmd"}),
      "--job-id must not be empty");
  EXPECT_EQ(
      parse_error({"-np", "1", "--rsh", " \t", "cmd"}),
      "--rsh must not be empty");
  EXPECT_EQ(
      parse_error({"-np", "1", "--timeline", "", "cmd"}),
      "--timeline must not be empty");
  EXPECT_EQ(
      parse_error({"-np", "1", "--host", "", "cmd"}),
      "--host must not be empty");
  EXPECT_EQ(
      parse_error({"-np", "1", "-x", "=1", "cmd"}),
      "-x expects NAME or NAME=VALUE, got '=1'");
  EXPECT_EQ(
      parse_error({"-x", "", "cmd"}), "-x expects NAME or NAME=VALUE, got ''");
  EXPECT_EQ(parse_error({"-H", ",", "cmd"}), "-H names no host");
  EXPECT_EQ(
      parse_error({"--hosts", "a:0", "cmd"}),
      "--hosts: 'a:0' needs a positive slot count after ':'");
  EXPECT_EQ(
      parse_error({"cmd"}),
      "missing -np N (the number of ranks) or -H HOST:SLOTS,...");
  EXPECT_EQ(parse_error({"-np", "2"}), "no command given");
  EXPECT_EQ(parse_error({"-np", "2", "--"}), "no command given");
}

TEST(RonderunOptions, ParsesOnlyPlainDecimalDigits) {
  long v = -1;
  EXPECT_TRUE(parse_int("007", 1, 10, v));
  EXPECT_EQ(v, 7);
  for (const char* bad :
       {"", "+3", " 3", "3 ", "11", "0", "1234567890123456789"}) {
    EXPECT_FALSE(parse_int(bad, 1, 10, v)) << "'" << bad << "'";
  }
  EXPECT_EQ(v, 7);
}

// --- hosts ------------------------------------------------------------------

TEST(RonderunHosts, ParsesHostListsWithSlotsAndIpv6) {
  std::vector<HostSlots> hosts;
  EXPECT_EQ(parse_host_list("a:2,,b,[fd00::1]:3,[fd00::2]", "-H", hosts), "");
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[0].host, "a");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].host, "b");
  EXPECT_EQ(hosts[1].slots, 1);
  EXPECT_EQ(hosts[2].host, "fd00::1");
  EXPECT_EQ(hosts[2].slots, 3);
  EXPECT_EQ(hosts[3].host, "fd00::2");
  EXPECT_EQ(hosts[3].slots, 1);
}

TEST(RonderunHosts, RefusesBadHostListsWithTheirMessage) {
  std::vector<HostSlots> hosts;
  EXPECT_EQ(
      parse_host_list("a:x", "-H", hosts),
      "-H: 'a:x' needs a positive slot count after ':'");
  EXPECT_EQ(
      parse_host_list("a:", "-H", hosts),
      "-H: 'a:' needs a positive slot count after ':'");
  EXPECT_EQ(parse_host_list(":2", "-H", hosts), "-H: a host name is empty");
  EXPECT_TRUE(hosts.empty());
}

TEST(RonderunHosts, TellsLocalHosts) {
  for (const char* local : {"localhost", "127.0.0.1", "127.1.2.3", "::1"}) {
    EXPECT_TRUE(is_local_host(local)) << local;
  }
  for (const char* remote : {"node1", "10.0.0.1", "fd00::1"}) {
    EXPECT_FALSE(is_local_host(remote)) << remote;
  }
}

TEST(RonderunHosts, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_quote("a-b_c./=:,+@%9"), "a-b_c./=:,+@%9");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
}

TEST(RonderunHosts, SplitsTheTemplateIntoWords) {
  EXPECT_EQ(
      split_words("  ssh -o 'Batch Mode=yes'  \"{host}\"\tx''y ''"),
      (Strings{"ssh", "-o", "Batch Mode=yes", "{host}", "xy", ""}));
  EXPECT_EQ(split_words(" \t "), Strings{});
  EXPECT_EQ(replace_all("{host}:{host}", "{host}", "n1"), "n1:n1");
  EXPECT_EQ(replace_all("{host}", "{host}", "{host}{host}"), "{host}{host}");
}

TEST(RonderunHosts, BuildsTheRemoteCommandLine) {
  EXPECT_EQ(
      remote_argv(
          "ssh -o BatchMode=yes {host}",
          "node1",
          {"A=1", "B=x y"},
          "/work dir",
          {"python", "a b"},
          false),
      (Strings{
          "ssh",
          "-o",
          "BatchMode=yes",
          "node1",
          "cd '/work dir' 2>/dev/null; exec env A=1 'B=x y' python 'a b'"}));
  EXPECT_EQ(
      remote_argv("sh -c", "n", {}, "", {"cmd"}, true),
      (Strings{
          "sh",
          "-c",
          "umask 077; f=$(mktemp) && cat > \"$f\" && exec 3< \"$f\" && "
          "rm -f \"$f\" || exit 1; export RONDE_JOB_SECRET_FILE=/dev/fd/3; "
          "exec env cmd"}));
}

// --- the ranks' environment -------------------------------------------------

TEST(RonderunRankEnv, FillsHostsInOrderWithLocalAndCrossPlaces) {
  const std::vector<RankSlot> s =
      assign_slots({{"a", 2}, {"b", 1}, {"c", 2}}, 4);
  ASSERT_EQ(s.size(), 4u);
  const int expected[4][6] = {
      // host, local rank, local size, cross rank, cross size
      {0, 0, 2, 0, 3},
      {0, 1, 2, 0, 1},
      {1, 0, 1, 1, 3},
      {2, 0, 1, 2, 3},
  };
  for (size_t r = 0; r < s.size(); ++r) {
    EXPECT_EQ(s[r].host_index, expected[r][0]) << r;
    EXPECT_EQ(s[r].local_rank, expected[r][1]) << r;
    EXPECT_EQ(s[r].local_size, expected[r][2]) << r;
    EXPECT_EQ(s[r].cross_rank, expected[r][3]) << r;
    EXPECT_EQ(s[r].cross_size, expected[r][4]) << r;
  }
  EXPECT_EQ(s[3].host, "c");
}

TEST(RonderunRankEnv, GivesALocalJobItsOwnVariablesOnly) {
  const Options o =
      parsed({"-np", "2", "--port", "29500", "--job-id", "j", "cmd"});
  JobContext job;
  job.secret_file = "/s/secret";
  job.cwd = "/w";
  const std::vector<RankLaunch> l = rank_launches(
      o,
      {"HOME=/h",
       "RONDE_RANK=7",
       "RONDE_JOB_ID=outer",
       "RONDE_TIMEOUT_SECONDS=9",
       "RONDE_TIMELINE=/t",
       "RONDE_JOB_SECRET_FILE=/old"},
      job);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_TRUE(l[0].argv.empty());
  EXPECT_TRUE(l[1].argv.empty());
  EXPECT_EQ(
      l[1].env,
      (Strings{
          "HOME=/h",
          "RONDE_TIMEOUT_SECONDS=9",
          "RONDE_TIMELINE=/t",
          "RONDE_RANK=1",
          "RONDE_SIZE=2",
          "RONDE_LOCAL_RANK=1",
          "RONDE_LOCAL_SIZE=2",
          "RONDE_CROSS_RANK=0",
          "RONDE_CROSS_SIZE=1",
          "RONDE_RENDEZVOUS_ADDR=127.0.0.1",
          "RONDE_RENDEZVOUS_PORT=29500",
          "RONDE_JOB_ID=j",
          "RONDE_JOB_SECRET_FILE=/s/secret",
          "RONDE_BIND_TO=core"}));
}

TEST(RonderunRankEnv, TimeoutTimelineAndExportsReplaceInherited) {
  const Options o = parsed(
      {"-np",
       "1",
       "--timeout",
       "60",
       "--timeline",
       "/tl",
       "-x",
       "FOO=bar",
       "-x",
       "KEEP",
       "cmd"});
  const Strings base = base_environment(
      o, {"RONDE_TIMEOUT_SECONDS=9", "RONDE_TIMELINE=/t", "KEEP=k", "=odd"});
  EXPECT_EQ(base, (Strings{"KEEP=k", "=odd", "FOO=bar"}));
  RankSlot slot;
  EXPECT_EQ(
      rank_variables(o, 0, slot, ""),
      (Strings{
          "RONDE_RANK=0",
          "RONDE_SIZE=1",
          "RONDE_LOCAL_RANK=0",
          "RONDE_LOCAL_SIZE=1",
          "RONDE_CROSS_RANK=0",
          "RONDE_CROSS_SIZE=1",
          "RONDE_RENDEZVOUS_ADDR=127.0.0.1",
          "RONDE_RENDEZVOUS_PORT=0",
          "RONDE_JOB_ID=",
          "RONDE_TIMEOUT_SECONDS=60",
          "RONDE_BIND_TO=core",
          "RONDE_TIMELINE=/tl/timeline.{rank}.json"}));
}

TEST(RonderunRankEnv, StartsOtherHostsRanksThroughTheTemplate) {
  const Options o = parsed(
      {"-H",
       "localhost:1,node1:1",
       "--rsh",
       "sh -c",
       "--port",
       "7",
       "--host",
       "10.0.0.1",
       "--job-id",
       "j",
       "-x",
       "KEEP",
       "-x",
       "SET=1",
       "run",
       "it"});
  JobContext job;
  job.secret_file = "/s/secret";
  job.secret_on_stdin = true;
  job.cwd = "/w";
  const std::vector<RankLaunch> l = rank_launches(
      o, {"HOME=/h", "PATH=/bin", "GLOO_X=1", "KEEP=k", "OTHER=o"}, job);
  ASSERT_EQ(l.size(), 2u);
  // localhost runs without the template and reads the secret's file here.
  EXPECT_TRUE(l[0].argv.empty());
  EXPECT_EQ(
      l[0].env,
      (Strings{
          "HOME=/h",
          "PATH=/bin",
          "GLOO_X=1",
          "KEEP=k",
          "OTHER=o",
          "SET=1",
          "RONDE_RANK=0",
          "RONDE_SIZE=2",
          "RONDE_LOCAL_RANK=0",
          "RONDE_LOCAL_SIZE=1",
          "RONDE_CROSS_RANK=0",
          "RONDE_CROSS_SIZE=2",
          "RONDE_RENDEZVOUS_ADDR=10.0.0.1",
          "RONDE_RENDEZVOUS_PORT=7",
          "RONDE_JOB_ID=j",
          "RONDE_JOB_SECRET_FILE=/s/secret",
          "RONDE_BIND_TO=core"}));
  // node1's rank gets only the forwarded variables, and its secret on stdin.
  EXPECT_EQ(
      l[1].argv,
      (Strings{
          "sh",
          "-c",
          "cd /w 2>/dev/null; umask 077; f=$(mktemp) && cat > \"$f\" && "
          "exec 3< \"$f\" && rm -f \"$f\" || exit 1; export "
          "RONDE_JOB_SECRET_FILE=/dev/fd/3; exec env PATH=/bin GLOO_X=1 "
          "KEEP=k SET=1 RONDE_RANK=1 RONDE_SIZE=2 RONDE_LOCAL_RANK=0 "
          "RONDE_LOCAL_SIZE=1 RONDE_CROSS_RANK=1 RONDE_CROSS_SIZE=2 "
          "RONDE_RENDEZVOUS_ADDR=10.0.0.1 RONDE_RENDEZVOUS_PORT=7 "
          "RONDE_JOB_ID=j RONDE_BIND_TO=core run it"}));
  EXPECT_EQ(
      remote_environment(
          {"A=1",
           "OMP_NUM_THREADS=2",
           "NCCL_X=",
           "VIRTUAL_ENV=/v",
           "PYTHONPATH=p",
           "LD_LIBRARY_PATH=l",
           "MYVAR=m"},
          {"MYVAR"}),
      (Strings{
          "OMP_NUM_THREADS=2",
          "NCCL_X=",
          "VIRTUAL_ENV=/v",
          "PYTHONPATH=p",
          "LD_LIBRARY_PATH=l",
          "MYVAR=m"}));
}

}  // namespace
}  // namespace ronde::detail
