// TrainingMonitor in one process (rank 0 of 1): progress lines, epoch
// summaries, the JSON lines file, and the figures behind them. The averaging
// over ranks is exercised by the example jobs (tests/examples).
#include <ronde/metrics.h>

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include <time.h>

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) {
    lines.push_back(l);
  }
  return lines;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/ronde_metrics_test_" +
         std::to_string(::getpid()) + "_" + name;
}

TEST(TrainingMonitor, FormatsDurations) {
  EXPECT_EQ(ronde::TrainingMonitor::format_duration(0), "0s");
  EXPECT_EQ(ronde::TrainingMonitor::format_duration(44.6), "45s");
  EXPECT_EQ(ronde::TrainingMonitor::format_duration(187), "3m07s");
  EXPECT_EQ(ronde::TrainingMonitor::format_duration(3720), "1h02m");
  EXPECT_EQ(ronde::TrainingMonitor::format_duration(-1), "?");
  EXPECT_EQ(ronde::TrainingMonitor::format_duration(NAN), "?");
}

TEST(TrainingMonitor, ProgressLinesAverageTheWindow) {
  std::ostringstream out;
  auto json = temp_path("window.jsonl");
  ronde::TrainingMonitor m(
      ronde::MonitorOptions()
          .log_every(2)
          .epochs(2)
          .steps_per_epoch(4)
          .metrics_out(json),
      out);
  ASSERT_TRUE(m.printing());
  m.start_epoch();
  const double waits[] = {0.0, 0.01, 0.02, 0.02};
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    m.step(/*loss=*/i + 1, /*samples=*/32, waits[i]);
  }
  // The second window: losses 3 and 4, 2 x 40 ms with 40 ms of waiting.
  const auto& p = m.last_progress();
  EXPECT_EQ(p.epoch, 1);
  EXPECT_EQ(p.step, 4);
  EXPECT_EQ(p.global_step, 4);
  EXPECT_DOUBLE_EQ(p.loss, 3.5);
  EXPECT_NEAR(p.step_seconds, 0.040, 0.030);
  EXPECT_NEAR(p.comm_wait_share, 0.5, 0.3);
  EXPECT_NEAR(p.samples_per_s, 32 / p.step_seconds, 1e-6 * p.samples_per_s);
  // 4 of 8 steps left.
  EXPECT_NEAR(p.eta_seconds, 4 * p.step_seconds, 1e-9);

  auto e = m.end_epoch({{"val_acc", 81.25}});
  EXPECT_EQ(e.epoch, 1);
  EXPECT_EQ(e.steps, 4);
  EXPECT_DOUBLE_EQ(e.train_loss, 2.5);
  EXPECT_NEAR(e.seconds, 0.160, 0.120);
  ASSERT_EQ(m.epochs().size(), 1u);

  const std::string text = out.str();
  EXPECT_NE(text.find("epoch 1/2 step 2/4  loss 1.5000  "), std::string::npos)
      << text;
  EXPECT_NE(text.find("epoch 1/2 step 4/4  loss 3.5000  "), std::string::npos)
      << text;
  EXPECT_NE(text.find(" samples/s  "), std::string::npos) << text;
  EXPECT_NE(text.find(" ms/step  comm wait "), std::string::npos) << text;
  EXPECT_NE(text.find("  ETA "), std::string::npos) << text;
  EXPECT_NE(text.find("epoch 1/2 done in "), std::string::npos) << text;
  EXPECT_NE(text.find("train loss 2.5000"), std::string::npos) << text;
  EXPECT_NE(text.find("val_acc 81.2500"), std::string::npos) << text;

  auto lines = read_lines(json);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(
      lines[0].rfind(
          "{\"event\":\"step\",\"rank\":0,\"size\":1,\"epoch\":1,\"epochs\":2,"
          "\"step\":2,",
          0),
      0u)
      << lines[0];
  EXPECT_NE(lines[1].find("\"loss\":3.5,"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("{\"event\":\"epoch\""), std::string::npos)
      << lines[2];
  EXPECT_NE(lines[2].find("\"train_loss\":2.5,"), std::string::npos)
      << lines[2];
  EXPECT_NE(lines[2].find("\"val_acc\":81.25,"), std::string::npos) << lines[2];
  for (const auto& l : lines) {
    EXPECT_EQ(l.back(), '}') << l;
  }
  std::remove(json.c_str());
}

TEST(TrainingMonitor, ADivergedLossIsNullInJson) {
  std::ostringstream out;
  auto json = temp_path("nan.jsonl");
  ronde::TrainingMonitor m(
      ronde::MonitorOptions().log_every(1).metrics_out(json), out);
  m.start_epoch();
  m.step(NAN, 8);
  auto lines = read_lines(json);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("\"loss\":null,"), std::string::npos) << lines[0];
  // No steps_per_epoch: no step total and no ETA.
  EXPECT_NE(lines[0].find("\"eta_seconds\":null,"), std::string::npos)
      << lines[0];
  EXPECT_EQ(out.str().find("ETA"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("step 1  loss nan"), std::string::npos) << out.str();
  std::remove(json.c_str());
}

TEST(TrainingMonitor, LogEveryZeroPrintsEpochSummariesOnly) {
  std::ostringstream out;
  ronde::TrainingMonitor m(ronde::MonitorOptions().log_every(0), out);
  m.start_epoch();
  for (int i = 0; i < 10; ++i) {
    m.step(1, 1);
  }
  EXPECT_EQ(out.str().find(" step "), std::string::npos) << out.str();
  m.end_epoch();
  EXPECT_NE(out.str().find("epoch 1/1 done in"), std::string::npos)
      << out.str();
}

TEST(TrainingMonitor, AllRanksPrefixesTheRank) {
  std::ostringstream out;
  ::setenv("RONDE_LOG_ALL_RANKS", "1", 1);
  ronde::TrainingMonitor m(ronde::MonitorOptions().log_every(1), out);
  ::unsetenv("RONDE_LOG_ALL_RANKS");
  m.start_epoch();
  m.step(1, 1);
  EXPECT_EQ(out.str().rfind("rank 0: epoch 1/1 step 1", 0), 0u) << out.str();
}

TEST(TrainingMonitor, MisuseIsAClearError) {
  std::ostringstream out;
  ronde::TrainingMonitor m(ronde::MonitorOptions(), out);
  try {
    m.step(1, 1);
    FAIL() << "step() before start_epoch() was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("rank 0 called step() before start_epoch()"),
        std::string::npos);
  }
  try {
    ronde::TrainingMonitor bad(
        ronde::MonitorOptions().metrics_out("/nonexistent/dir/m.jsonl"), out);
    FAIL() << "an unwritable metrics file was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "cannot open the metrics file '/nonexistent/dir/m.jsonl'"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      ronde::TrainingMonitor(ronde::MonitorOptions().log_every(-1), out),
      c10::Error);
}

}  // namespace

namespace {

TEST(TrainingMonitor, AResumedEpochCountsFromWhereItStopped) {
  std::ostringstream out;
  ronde::TrainingMonitor m(
      ronde::MonitorOptions().log_every(1).epochs(2).steps_per_epoch(4), out);
  m.start_epoch(/*epoch=*/1, /*steps_done=*/2);
  m.step(1, 1);
  EXPECT_EQ(m.last_progress().epoch, 2);
  EXPECT_EQ(m.last_progress().step, 3);
  EXPECT_EQ(m.last_progress().global_step, 7);
  EXPECT_NEAR(
      m.last_progress().eta_seconds, m.last_progress().step_seconds, 1e-12);
  EXPECT_NE(out.str().find("epoch 2/2 step 3/4"), std::string::npos)
      << out.str();
}

}  // namespace

namespace {

// A field of /proc/self/status in MiB ("VmRSS", "VmHWM").
double proc_status_mb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(field + ":", 0) == 0)
      return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return -1;
}

// The process's CPU seconds and the wall clock's, now.
std::pair<double, double> cpu_and_wall() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return {
      static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9,
      std::chrono::duration<double>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count()};
}

// The process's CPU time over the wall time between `from` and `to`, in
// percent of one core.
double cpu_percent_between(
    std::pair<double, double> from, std::pair<double, double> to) {
  return 100 * (to.first - from.first) / (to.second - from.second);
}

TEST(TrainingMonitor, ResourceFiguresMatchTheProcess) {
  std::ostringstream out;
  auto json = temp_path("resources.jsonl");
  ronde::TrainingMonitor m(
      ronde::MonitorOptions().log_every(2).metrics_out(json), out);
  // The monitor's CPU figures against the process's own clock over about
  // the same windows: a loaded machine gives the spinning thread less
  // than a core, and both see that.
  const auto epoch_start = cpu_and_wall();
  m.start_epoch();
  // A busy window, then an idle one.
  auto spin = [] {
    auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(80);
    volatile double x = 0;
    while (std::chrono::steady_clock::now() < until)
      x = x + 1;
  };
  spin();
  m.step(1, 8);
  spin();
  m.step(1, 8);
  const auto busy_end = cpu_and_wall();
  const double rss_before = proc_status_mb("VmRSS");
  const ronde::ResourceStats busy = m.last_progress().resources;
  const double rss_after = proc_status_mb("VmRSS");
  const double hwm = proc_status_mb("VmHWM");
  EXPECT_NEAR(busy.cpu_percent, cpu_percent_between(epoch_start, busy_end), 15);
  EXPECT_GT(busy.cpu_percent, 10);   // the thread spun
  EXPECT_LT(busy.cpu_percent, 150);  // one thread spinning
  EXPECT_DOUBLE_EQ(busy.cpu_percent_max, busy.cpu_percent);  // one rank
  EXPECT_GT(busy.rss_mb, 1);
  EXPECT_GE(busy.rss_mb, std::min(rss_before, rss_after) - 4);
  EXPECT_LE(busy.rss_mb, std::max(rss_before, rss_after) + 4);
  EXPECT_GE(busy.peak_rss_mb, busy.rss_mb - 1);
  EXPECT_LE(busy.peak_rss_mb, hwm + 1);
  EXPECT_FALSE(busy.cuda);
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    m.step(1, 8);
  }
  EXPECT_LT(m.last_progress().resources.cpu_percent, 40);
  const auto e = m.end_epoch();
  const double epoch = cpu_percent_between(epoch_start, cpu_and_wall());
  EXPECT_NEAR(e.resources.cpu_percent, epoch, 15);
  EXPECT_LT(e.resources.cpu_percent, 90);  // half the epoch was idle
  EXPECT_NE(out.str().find("  cpu "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find(" MiB (peak "), std::string::npos) << out.str();
  auto lines = read_lines(json);
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& l : lines) {
    EXPECT_NE(l.find("\"rss_mb\":"), std::string::npos) << l;
    EXPECT_NE(l.find("\"peak_rss_mb\":"), std::string::npos) << l;
    EXPECT_NE(l.find("\"cpu_percent_max\":"), std::string::npos) << l;
  }
  std::remove(json.c_str());
}

}  // namespace
