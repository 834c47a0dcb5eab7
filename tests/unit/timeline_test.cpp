// The timeline file in one process: well-formed Chrome-trace JSON, spans and
// instants on named tracks, nothing written while off.
#include <ronde/timeline.h>

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <unistd.h>
#include <fstream>
#include <sstream>
#include <thread>

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) {
    lines.push_back(l);
  }
  return lines;
}

size_t count(const std::vector<std::string>& lines, const std::string& needle) {
  size_t n = 0;
  for (const auto& l : lines) {
    n += l.find(needle) != std::string::npos;
  }
  return n;
}

TEST(Timeline, WritesAChromeTrace) {
  const std::string path =
      "/tmp/ronde_timeline_test_" + std::to_string(::getpid()) + ".json";
  { ronde::TimelineRange off("before start"); }
  EXPECT_FALSE(ronde::timeline_enabled());
  ronde::start_timeline(path);
  EXPECT_TRUE(ronde::timeline_enabled());
  EXPECT_EQ(ronde::timeline_path(), path);  // one process: the name as given
  {
    ronde::TimelineRange r("data \"loading\"");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::thread([] {
    ronde::detail::timeline_thread_name("communication");
    ronde::detail::timeline_instant(
        "hook ready", "hook", "\"param\":\"fc.weight\"");
  }).join();
  ronde::stop_timeline();
  EXPECT_FALSE(ronde::timeline_enabled());
  { ronde::TimelineRange off("after stop"); }

  auto lines = lines_of(path);
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines.front(), "[");
  EXPECT_EQ(lines.back(), "]");
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i].front(), '{') << lines[i];
    EXPECT_EQ(lines[i].back(), i + 2 < lines.size() ? ',' : '}') << lines[i];
  }
  EXPECT_EQ(count(lines, "\"name\":\"process_name\""), 1u);
  EXPECT_EQ(
      count(
          lines,
          "\"name\":\"data \\\"loading\\\"\",\"cat\":\"user\",\"ph\":\"X\""),
      1u);
  EXPECT_EQ(count(lines, "\"args\":{\"name\":\"communication\"}"), 1u);
  EXPECT_EQ(
      count(lines, "\"name\":\"hook ready\",\"cat\":\"hook\",\"ph\":\"i\""),
      1u);
  EXPECT_EQ(count(lines, "\"args\":{\"param\":\"fc.weight\"}"), 1u);
  EXPECT_EQ(count(lines, "before start"), 0u);
  EXPECT_EQ(count(lines, "after stop"), 0u);
  // The span lasted at least the 2 ms slept.
  for (const auto& l : lines) {
    auto at = l.find("\"dur\":");
    if (l.find("loading") != std::string::npos && at != std::string::npos) {
      EXPECT_GE(std::stoll(l.substr(at + 6)), 2000) << l;
    }
  }
  std::remove(path.c_str());
}

TEST(Timeline, AnUnwritablePathIsAClearError) {
  try {
    ronde::start_timeline("/nonexistent/dir/t.json");
    FAIL() << "accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "rank 0 cannot open the timeline file '/nonexistent/dir/t.json'"),
        std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(ronde::timeline_enabled());
}

}  // namespace
