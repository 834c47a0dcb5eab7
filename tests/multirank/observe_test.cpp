// What a user sees of a 2-rank run from outside: the PyTorch profiler's
// trace with ronde's ranges (worker_observe.cpp checks the events in
// process; here the files), and TrainingMonitor's resource figures.
#include "harness.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace {

using ronde::testing::JobResult;
using ronde::testing::make_temp_dir;
using ronde::testing::run_job;
using ronde::testing::worker_spec;

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Observe, ProfilerTracesHoldRondesRanges) {
  const std::string dir = make_temp_dir();
  JobResult r = run_job(worker_spec({"profiler", dir}, 2));
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string trace =
        read_file(dir + "/trace." + std::to_string(rank) + ".json");
    ASSERT_FALSE(trace.empty()) << "rank " << rank << " wrote no trace";
    EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
    for (const char* name :
         {"ronde::pack",
          "ronde::allreduce",
          "ronde::wait",
          "ronde::step",
          "ronde::checkpoint_save",
          "load batch",
          "aten::mm"}) {
      EXPECT_NE(trace.find(std::string("\"") + name + "\""), std::string::npos)
          << "rank " << rank << "'s trace has no " << name;
    }
  }
}

// An asynchronous all-reduce waited on at once runs on the waiting thread
// when the communication thread is idle and the call is within
// RONDE_HELP_BYTES; larger ones and the optimizer's bucket all-reduces
// stay on the communication thread (worker_observe.cpp).
TEST(Observe, AWaiterRunsQueuedCollectivesButNoHookTask) {
  auto spec = worker_spec({"waiter_helps"}, 2);
  spec.env["RONDE_HELP_BYTES"] = "8192";
  JobResult r = run_job(spec);
  EXPECT_TRUE(r.all_succeeded()) << r.dump();
}

TEST(Observe, MonitorReportsResourcesOverRanks) {
  const std::string dir = make_temp_dir();
  JobResult r = run_job(worker_spec({"monitor_resources", dir}, 2));
  ASSERT_TRUE(r.all_succeeded()) << r.dump();
  std::ifstream f(dir + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(f, line); ++lines) {
    for (const char* field :
         {"\"cpu_percent\":",
          "\"cpu_percent_max\":",
          "\"rss_mb\":",
          "\"rss_mb_max\":",
          "\"peak_rss_mb\":"}) {
      EXPECT_NE(line.find(field), std::string::npos) << field << " in " << line;
    }
    EXPECT_EQ(line.find("cuda_"), std::string::npos) << line;
  }
  EXPECT_EQ(lines, 3);  // two progress lines and the epoch
}

}  // namespace
