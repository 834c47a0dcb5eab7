// Tests of the ronderun launcher: runs the built binary on small `sh -c`
// jobs and checks the environment it gives the ranks, how it tags their
// output, and how it stops the job when a rank fails or a signal arrives.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "timeline_merge.h"

#ifndef RONDERUN_PATH
#error "RONDERUN_PATH must name the ronderun binary under test"
#endif

namespace ronde {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// Generous on purpose: a correct ronderun finishes every job here in a few
// seconds, and only a broken one (a rank left running) gets near this.
constexpr double kTimeoutSeconds = 30.0;
constexpr int kNotExited = -1;

struct RunResult {
  int exit_code = kNotExited;  // 128 + signal if ronderun itself was killed
  bool timed_out = false;
  std::string out;
  std::string err;
};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  std::string line;
  while (std::getline(stream, line)) {
    lines.push_back(line);
  }
  return lines;
}

// The lines of `text`, in no order: ranks' lines interleave.
std::set<std::string> line_set(const std::string& text) {
  const std::vector<std::string> lines = split_lines(text);
  return {lines.begin(), lines.end()};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One ronderun process with its stdout and stderr captured separately.
class RonderunProcess {
 public:
  RonderunProcess(
      const std::vector<std::string>& args,
      const std::vector<std::pair<std::string, std::string>>& env = {}) {
    int out_pipe[2];
    int err_pipe[2];
    if (pipe(out_pipe) < 0 || pipe(err_pipe) < 0) {
      ADD_FAILURE() << "pipe: " << strerror(errno);
      return;
    }
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    std::vector<std::string> argv_storage = {RONDERUN_PATH};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_storage) {
      argv.push_back(&arg[0]);
    }
    argv.push_back(nullptr);

    pid_ = fork();
    if (pid_ == 0) {
      // ronderun keeps ignoring a signal it inherits as ignored (as after
      // `ctest &` in a script), which would defeat the forwarding tests.
      for (int signo : {SIGINT, SIGTERM, SIGHUP}) {
        (void)signal(signo, SIG_DFL);
      }
      sigset_t none;
      sigemptyset(&none);
      (void)sigprocmask(SIG_SETMASK, &none, nullptr);
      // Keep settings of the machine running the tests out of the job.
      unsetenv("RONDE_TIMEOUT_SECONDS");
      unsetenv("RONDE_KILL_GRACE_SECONDS");
      for (const auto& entry : env) {
        setenv(entry.first.c_str(), entry.second.c_str(), 1);
      }
      const int dev_null = open("/dev/null", O_RDONLY);
      if (dev_null < 0 || dup2(dev_null, STDIN_FILENO) < 0 ||
          dup2(out_pipe[1], STDOUT_FILENO) < 0 ||
          dup2(err_pipe[1], STDERR_FILENO) < 0) {
        _exit(126);
      }
      execv(argv[0], argv.data());
      _exit(126);
    }
    (void)close(out_pipe[1]);
    (void)close(err_pipe[1]);
    out_fd_ = out_pipe[0];
    err_fd_ = err_pipe[0];
    if (pid_ < 0) {
      ADD_FAILURE() << "fork: " << strerror(errno);
      close_fds();
    }
  }

  RonderunProcess(const RonderunProcess&) = delete;
  RonderunProcess& operator=(const RonderunProcess&) = delete;

  ~RonderunProcess() {
    if (pid_ > 0 && !reaped_) {
      (void)kill(pid_, SIGKILL);
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    close_fds();
  }

  pid_t pid() const {
    return pid_;
  }

  const std::string& out() const {
    return out_;
  }

  // Collects output until `done` holds, the pipes close or time runs out.
  bool read_until(
      const std::function<bool(const std::string&, const std::string&)>& done,
      double timeout_seconds) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeout_seconds));
    while (!done(out_, err_)) {
      if ((out_fd_ < 0 && err_fd_ < 0) || Clock::now() >= deadline) {
        return false;
      }
      pump(100);
    }
    return true;
  }

  RunResult wait(double timeout_seconds = kTimeoutSeconds) {
    RunResult result;
    if (pid_ <= 0) {
      return result;
    }
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(timeout_seconds));
    while ((out_fd_ >= 0 || err_fd_ >= 0) && Clock::now() < deadline) {
      pump(100);
    }
    int status = 0;
    while (!reaped_) {
      const pid_t got = waitpid(pid_, &status, WNOHANG);
      if (got == pid_) {
        reaped_ = true;
      } else if (got < 0 && errno != EINTR) {
        ADD_FAILURE() << "waitpid: " << strerror(errno);
        return result;
      } else if (Clock::now() >= deadline) {
        result.timed_out = true;
        (void)kill(pid_, SIGKILL);
        while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        reaped_ = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    // Whatever is still buffered after a kill is worth seeing in a failure.
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      pump(100);
    }
    if (WIFEXITED(status)) {
      result.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      result.exit_code = 128 + WTERMSIG(status);
    }
    result.out = out_;
    result.err = err_;
    return result;
  }

 private:
  void pump(int timeout_ms) {
    struct pollfd fds[2];
    int* owners[2];
    nfds_t count = 0;
    for (int* fd : {&out_fd_, &err_fd_}) {
      if (*fd >= 0) {
        fds[count] = {*fd, POLLIN, 0};
        owners[count] = fd;
        ++count;
      }
    }
    if (count == 0 || poll(fds, count, timeout_ms) <= 0) {
      return;
    }
    for (nfds_t i = 0; i < count; ++i) {
      if (fds[i].revents == 0) {
        continue;
      }
      char buffer[65536];
      const ssize_t n = read(*owners[i], buffer, sizeof(buffer));
      if (n > 0) {
        (owners[i] == &out_fd_ ? out_ : err_).append(buffer, n);
      } else if (n == 0 || errno != EINTR) {
        (void)close(*owners[i]);
        *owners[i] = -1;
      }
    }
  }

  void close_fds() {
    for (int* fd : {&out_fd_, &err_fd_}) {
      if (*fd >= 0) {
        (void)close(*fd);
        *fd = -1;
      }
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
};

RunResult run_ronderun(
    const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, std::string>>& env = {}) {
  RonderunProcess process(args, env);
  return process.wait();
}

// Counts a zombie as gone: in some containers PID 1 never reaps the
// orphans it inherits, yet such a process no longer runs anything.
bool process_gone(pid_t pid) {
  if (kill(pid, 0) < 0 && errno == ESRCH) {
    return true;
  }
  std::ifstream stat_file("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(stat_file, stat)) {
    return kill(pid, 0) < 0 && errno == ESRCH;
  }
  const size_t name_end = stat.rfind(')');
  return name_end != std::string::npos && name_end + 2 < stat.size() &&
         stat[name_end + 2] == 'Z';
}

class RonderunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "ronderun_test_XXXXXX";
    ASSERT_NE(mkdtemp(&pattern[0]), nullptr) << strerror(errno);
    temp_dir_ = pattern;
  }

  void TearDown() override {
    for (const std::string& file : files_) {
      (void)unlink(file.c_str());
    }
    (void)rmdir(temp_dir_.c_str());
  }

  std::string temp_file(const std::string& name) {
    files_.push_back(temp_dir_ + "/" + name);
    return files_.back();
  }

  std::string temp_dir_;
  std::vector<std::string> files_;
};

TEST_F(RonderunTest, GivesEachRankItsEnvironment) {
  const RunResult result = run_ronderun(
      {"-np",
       "3",
       "--",
       "sh",
       "-c",
       "echo $RONDE_RANK/$RONDE_SIZE/$RONDE_LOCAL_RANK/$RONDE_JOB_ID/"
       "$RONDE_RENDEZVOUS_PORT/$RONDE_LOCAL_SIZE/$RONDE_CROSS_RANK/"
       "$RONDE_CROSS_SIZE/$RONDE_RENDEZVOUS_ADDR/"
       "${RONDE_TIMEOUT_SECONDS-unset}"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = split_lines(result.out);
  ASSERT_EQ(lines.size(), 3u) << result.out;

  const std::regex line_re(
      R"(\[(\d+)\] (\d+)/3/(\d+)/([^/]+)/(\d+)/3/0/1/127\.0\.0\.1/unset)");
  std::set<std::string> ranks;
  std::set<std::string> job_ids;
  std::set<std::string> ports;
  for (const std::string& line : lines) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, line_re)) << line;
    EXPECT_EQ(match[1], match[2]) << "prefix and RONDE_RANK differ: " << line;
    EXPECT_EQ(match[2], match[3]) << "RONDE_LOCAL_RANK is wrong: " << line;
    ranks.insert(match[2]);
    job_ids.insert(match[4]);
    ports.insert(match[5]);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2"}));
  ASSERT_EQ(job_ids.size(), 1u) << "ranks got different job ids";
  EXPECT_EQ(job_ids.begin()->rfind("ronde-", 0), 0u) << *job_ids.begin();
  ASSERT_EQ(ports.size(), 1u) << "ranks got different ports";
  const long port = std::stol(*ports.begin());
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

TEST_F(RonderunTest, GeneratesADifferentJobIdEachRun) {
  const std::vector<std::string> args = {
      "-np", "1", "sh", "-c", "echo $RONDE_JOB_ID"};
  const RunResult first = run_ronderun(args);
  const RunResult second = run_ronderun(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_TRUE(std::regex_match(
      first.out, std::regex(R"(\[0\] ronde-\d+-[0-9a-f]{16}\n)")))
      << first.out;
  EXPECT_NE(first.out, second.out);
}

TEST_F(RonderunTest, PassesJobIdTimeoutPortAndHostThrough) {
  const RunResult result = run_ronderun(
      {"--job-id",
       "my-job",
       "--timeout",
       "42",
       "--port",
       "23456",
       "--host",
       "10.1.2.3",
       "-np",
       "2",
       "--",
       "sh",
       "-c",
       "echo $RONDE_JOB_ID/$RONDE_TIMEOUT_SECONDS/$RONDE_RENDEZVOUS_PORT/"
       "$RONDE_RENDEZVOUS_ADDR"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  std::vector<std::string> lines = split_lines(result.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(
      lines,
      (std::vector<std::string>{
          "[0] my-job/42/23456/10.1.2.3", "[1] my-job/42/23456/10.1.2.3"}));
}

TEST_F(RonderunTest, AcceptsNpAliasesAndNoDoubleDash) {
  for (const char* flag : {"-np", "-n", "--np"}) {
    const RunResult result = run_ronderun({flag, "2", "echo", "hi"});
    ASSERT_FALSE(result.timed_out);
    EXPECT_EQ(result.exit_code, 0) << flag << ": " << result.err;
    std::vector<std::string> lines = split_lines(result.out);
    std::sort(lines.begin(), lines.end());
    EXPECT_EQ(lines, (std::vector<std::string>{"[0] hi", "[1] hi"})) << flag;
  }
}

TEST_F(RonderunTest, NoPrefixLeavesLinesUntouched) {
  const RunResult result = run_ronderun(
      {"--no-prefix", "-np", "1", "sh", "-c", "echo out; echo err >&2"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "out\n");
  EXPECT_EQ(result.err, "err\n");
}

TEST_F(RonderunTest, SeparatesStderrAndFlushesPartialLines) {
  const RunResult result = run_ronderun(
      {"-np",
       "1",
       "--",
       "sh",
       "-c",
       "echo out; echo err >&2; printf xyz >&2; printf abc"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "[0] out\n[0] abc\n");
  EXPECT_EQ(result.err, "[0] err\n[0] xyz\n");
}

TEST_F(RonderunTest, KeepsLongLinesWholeAndUninterleaved) {
  constexpr size_t kLineLength = 200000;
  // Each rank writes lines of its own letter, the last one without a
  // newline, so any truncation or mixing of ranks shows in the letters.
  const RunResult result = run_ronderun(
      {"-np",
       "3",
       "--",
       "sh",
       "-c",
       "case $RONDE_RANK in 0) c=a;; 1) c=b;; *) c=c;; esac; "
       "for i in 1 2 3; do head -c 200000 /dev/zero | tr '\\0' $c; echo; "
       "done; head -c 200000 /dev/zero | tr '\\0' $c"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = split_lines(result.out);
  ASSERT_EQ(lines.size(), 12u);
  std::map<int, int> per_rank;
  for (const std::string& line : lines) {
    ASSERT_GE(line.size(), 4u);
    ASSERT_EQ(line[0], '[');
    ASSERT_EQ(line.substr(2, 2), "] ");
    const int rank = line[1] - '0';
    ASSERT_GE(rank, 0);
    ASSERT_LT(rank, 3);
    const std::string expected(kLineLength, static_cast<char>('a' + rank));
    EXPECT_TRUE(line.substr(4) == expected)
        << "rank " << rank << " line of length " << line.size() - 4
        << " is not " << kLineLength << " x '" << expected[0] << "'";
    ++per_rank[rank];
  }
  EXPECT_EQ(per_rank, (std::map<int, int>{{0, 4}, {1, 4}, {2, 4}}));
}

TEST_F(RonderunTest, KeepsEachRanksLinesWholeAndInOrder) {
  constexpr int kLines = 2000;
  const RunResult result = run_ronderun(
      {"-np",
       "4",
       "--",
       "sh",
       "-c",
       "i=0; while [ $i -lt 2000 ]; do "
       "echo \"rank$RONDE_RANK line $i ..........................\"; "
       "i=$((i + 1)); done"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const std::regex line_re(R"(\[(\d)\] rank(\d) line (\d+) \.{26})");
  std::map<int, int> next_line;
  for (const std::string& line : split_lines(result.out)) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, line_re)) << line;
    ASSERT_EQ(match[1], match[2]) << line;
    const int rank = std::stoi(match[1]);
    ASSERT_EQ(std::stoi(match[3]), next_line[rank]) << line;
    ++next_line[rank];
  }
  EXPECT_EQ(
      next_line,
      (std::map<int, int>{{0, kLines}, {1, kLines}, {2, kLines}, {3, kLines}}));
}

TEST_F(RonderunTest, StopsTheJobWithTheFailingRanksExitCode) {
  const auto start = Clock::now();
  const RunResult result = run_ronderun(
      {"-np",
       "3",
       "--",
       "sh",
       "-c",
       "if [ $RONDE_RANK = 1 ]; then exit 7; fi; sleep 60"});
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(result.timed_out) << "the sleeping ranks were not stopped";
  EXPECT_EQ(result.exit_code, 7) << result.err;
  EXPECT_LT(seconds, kTimeoutSeconds);
  EXPECT_TRUE(contains(result.err, "rank 1 exited with code 7")) << result.err;
}

TEST_F(RonderunTest, ReportsARankKilledByASignal) {
  const RunResult result = run_ronderun(
      {"-np",
       "2",
       "--",
       "sh",
       "-c",
       "if [ $RONDE_RANK = 0 ]; then kill -9 $$; fi; sleep 60"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 128 + SIGKILL) << result.err;
  EXPECT_TRUE(contains(result.err, "rank 0 was killed by signal SIGKILL"))
      << result.err;
}

TEST_F(RonderunTest, LeavesNoProcessesBehind) {
  const std::string pid_file = temp_file("pids");
  std::ofstream(pid_file).close();
  // Ranks 0 and 2 each start a background child and wait; rank 1 fails once
  // all four pids are written, so every one of them must then be stopped.
  // Rank 0's child does not hold the rank's output open, so only the signal
  // to the rank's whole process group can reach it.
  const RunResult result = run_ronderun(
      {"-np",
       "3",
       "--",
       "sh",
       "-c",
       "if [ $RONDE_RANK = 1 ]; then "
       "while [ $(wc -l < \"$PID_FILE\") -lt 4 ]; do sleep 0.05; done; "
       "exit 5; fi; "
       "if [ $RONDE_RANK = 0 ]; then sleep 60 > /dev/null 2>&1 & "
       "else sleep 60 & fi; "
       "echo $! >> \"$PID_FILE\"; echo $$ >> \"$PID_FILE\"; wait"},
      {{"PID_FILE", pid_file}});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 5) << result.err;

  std::ifstream pids_in(pid_file);
  std::vector<pid_t> pids;
  for (long pid = 0; pids_in >> pid;) {
    pids.push_back(static_cast<pid_t>(pid));
  }
  ASSERT_EQ(pids.size(), 4u);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (pid_t pid : pids) {
    while (!process_gone(pid) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(process_gone(pid)) << "process " << pid << " outlived the job";
  }
}

TEST_F(RonderunTest, ForwardsSigtermToEveryRank) {
  RonderunProcess process(
      {"-np",
       "3",
       "--",
       "sh",
       "-c",
       "trap 'echo got-term; exit 3' TERM; echo ready; "
       "while :; do sleep 0.1; done"});
  const bool all_ready = process.read_until(
      [](const std::string& out, const std::string&) {
        return contains(out, "[0] ready\n") && contains(out, "[1] ready\n") &&
               contains(out, "[2] ready\n");
      },
      kTimeoutSeconds);
  ASSERT_TRUE(all_ready) << process.out();
  ASSERT_EQ(kill(process.pid(), SIGTERM), 0) << strerror(errno);
  const RunResult result = process.wait();
  ASSERT_FALSE(result.timed_out);
  for (const char* line :
       {"[0] got-term\n", "[1] got-term\n", "[2] got-term\n"}) {
    EXPECT_TRUE(contains(result.out, line)) << result.out;
  }
  EXPECT_EQ(result.exit_code, 3) << result.err;
}

TEST_F(RonderunTest, ExitsWithTheSignalWhenRanksStopCleanly) {
  RonderunProcess process(
      {"-np",
       "2",
       "--",
       "sh",
       "-c",
       "trap 'echo got-int; exit 0' INT; echo ready; "
       "while :; do sleep 0.1; done"});
  const bool all_ready = process.read_until(
      [](const std::string& out, const std::string&) {
        return contains(out, "[0] ready\n") && contains(out, "[1] ready\n");
      },
      kTimeoutSeconds);
  ASSERT_TRUE(all_ready) << process.out();
  ASSERT_EQ(kill(process.pid(), SIGINT), 0) << strerror(errno);
  const RunResult result = process.wait();
  ASSERT_FALSE(result.timed_out);
  EXPECT_TRUE(contains(result.out, "[0] got-int\n")) << result.out;
  EXPECT_TRUE(contains(result.out, "[1] got-int\n")) << result.out;
  EXPECT_EQ(result.exit_code, 128 + SIGINT) << result.err;
}

TEST_F(RonderunTest, KillsRanksThatIgnoreSigterm) {
  const std::string marker = temp_file("trapped");
  // Rank 1 fails only once rank 0 ignores SIGTERM, so only the SIGKILL after
  // the grace period can end rank 0 before the test's timeout.
  const RunResult result = run_ronderun(
      {"-np",
       "2",
       "--",
       "sh",
       "-c",
       "if [ $RONDE_RANK = 1 ]; then "
       "while [ ! -e \"$MARKER\" ]; do sleep 0.05; done; exit 5; fi; "
       "trap '' TERM; touch \"$MARKER\"; while :; do sleep 0.1; done"},
      {{"MARKER", marker}, {"RONDE_KILL_GRACE_SECONDS", "1"}});
  ASSERT_FALSE(result.timed_out) << "a rank ignoring SIGTERM was not killed";
  EXPECT_EQ(result.exit_code, 5) << result.err;
  EXPECT_TRUE(contains(result.err, "rank 1 exited with code 5")) << result.err;
}

TEST_F(RonderunTest, ReportsACommandThatCannotRun) {
  const RunResult result =
      run_ronderun({"-np", "2", "--", "ronde-no-such-command-x9"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 127) << result.err;
  EXPECT_TRUE(contains(result.err, "ronde-no-such-command-x9")) << result.err;
}

TEST_F(RonderunTest, VerbosePrintsJobIdPortAndCommand) {
  const RunResult result = run_ronderun(
      {"--verbose", "--job-id", "vjob", "--port", "34567", "-np", "1", "true"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(contains(result.err, "vjob")) << result.err;
  EXPECT_TRUE(contains(result.err, "34567")) << result.err;
  EXPECT_TRUE(contains(result.err, "true")) << result.err;
  EXPECT_EQ(result.out, "");
}

TEST_F(RonderunTest, HelpGoesToStdoutAndSucceeds) {
  for (const char* flag : {"-h", "--help"}) {
    const RunResult result = run_ronderun({flag});
    EXPECT_EQ(result.exit_code, 0) << flag;
    EXPECT_TRUE(contains(result.out, "usage: ronderun")) << result.out;
    EXPECT_EQ(result.err, "");
  }
}

TEST_F(RonderunTest, RejectsBadArguments) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"echo", "hi"}, "-np"},
      {{"-np", "0", "echo"}, "'0'"},
      {{"-np", "x", "echo"}, "'x'"},
      {{"-np", "-1", "echo"}, "'-1'"},
      {{"-np"}, "'-np'"},
      {{"-np", "2", "--bogus", "echo"}, "'--bogus'"},
      {{"-np", "2"}, "no command"},
      {{"-np", "2", "--"}, "no command"},
      {{"-np", "2", "--timeout", "soon", "echo"}, "'soon'"},
      {{"-np", "2", "--port", "http", "echo"}, "'http'"},
      {{"-np", "2", "--port", "70000", "echo"}, "'70000'"},
      {{"-H", "a:0", "echo"}, "'a:0'"},
      {{"-H", "a:x", "echo"}, "'a:x'"},
      {{"-H", ",", "echo"}, "names no host"},
      {{"-H", "a:1,b:1", "-np", "3", "echo"}, "more ranks than the hosts"},
      {{"--hostfile", "/nonexistent/hosts", "echo"}, "cannot read"},
      {{"-H", "a", "--rsh", " ", "echo"}, "--rsh"},
      {{"-H", "a", "-x", "=v", "echo"}, "-x"},
  };
  for (const auto& test_case : cases) {
    std::string joined;
    for (const std::string& arg : test_case.first) {
      joined += " " + arg;
    }
    const RunResult result = run_ronderun(test_case.first);
    ASSERT_FALSE(result.timed_out) << joined;
    EXPECT_EQ(result.exit_code, 2) << joined;
    const std::vector<std::string> lines = split_lines(result.err);
    ASSERT_FALSE(lines.empty()) << joined;
    EXPECT_TRUE(contains(lines[0], "ronderun: ")) << joined << ": " << lines[0];
    EXPECT_TRUE(contains(lines[0], test_case.second))
        << joined << ": " << lines[0];
    EXPECT_TRUE(contains(result.err, "usage: ronderun")) << joined;
    EXPECT_EQ(result.out, "") << joined;
  }
}

// A remote-command template that runs "on" a host locally: each rank's
// command line arrives as one shell string, as ssh would pass it.
const char* kFakeRsh = "env FAKE_HOST={host} sh -c";

TEST_F(RonderunTest, StartsEachHostsRanksThroughTheTemplate) {
  const RunResult result = run_ronderun(
      {"-H",
       "hostA:2,hostB:1",
       "--host",
       "127.0.0.1",
       "--rsh",
       kFakeRsh,
       "-x",
       "EXTRA=with space",
       "--",
       "sh",
       "-c",
       "echo \"$FAKE_HOST $RONDE_RANK/$RONDE_SIZE $RONDE_LOCAL_RANK/"
       "$RONDE_LOCAL_SIZE $RONDE_CROSS_RANK/$RONDE_CROSS_SIZE "
       "$RONDE_RENDEZVOUS_ADDR [$EXTRA] $(pwd)\""});
  ASSERT_FALSE(result.timed_out);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  char cwd[4096] = {0};
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const std::string here = cwd;
  const std::set<std::string> lines = line_set(result.out);
  const std::set<std::string> want = {
      "[0] hostA 0/3 0/2 0/2 127.0.0.1 [with space] " + here,
      "[1] hostA 1/3 1/2 0/1 127.0.0.1 [with space] " + here,
      "[2] hostB 2/3 0/1 1/2 127.0.0.1 [with space] " + here,
  };
  EXPECT_EQ(lines, want) << result.out;
}

// What is in `dir` besides `keep`.
std::vector<std::string> other_entries(
    const std::string& dir, const std::string& keep) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != ".." && n != keep)
        names.push_back(n);
    }
    closedir(d);
  }
  return names;
}

TEST_F(RonderunTest, MakesAPrivateSecretPerJobAndRemovesIt) {
  // TMPDIR: where ronderun makes its private directory.
  const RunResult result = run_ronderun(
      {"-np",
       "2",
       "--",
       "sh",
       "-c",
       "echo \"$(stat -c %a \"$(dirname $RONDE_JOB_SECRET_FILE)\") "
       "$(stat -c %a $RONDE_JOB_SECRET_FILE) "
       "$(wc -c < $RONDE_JOB_SECRET_FILE)\""},
      {{"TMPDIR", temp_dir_}, {"RONDE_JOB_SECRET_FILE", ""}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // A 0700 directory, a 0600 file of 64 hex digits and a newline.
  EXPECT_EQ(
      line_set(result.out),
      (std::set<std::string>{"[0] 700 600 65", "[1] 700 600 65"}));
  EXPECT_EQ(other_entries(temp_dir_, ""), std::vector<std::string>{})
      << "left behind";
}

TEST_F(RonderunTest, HandsOtherHostsTheSecretWithoutLeavingAFile) {
  const std::string secret = temp_file("secret");
  std::ofstream(secret) << "a job secret, given by file\n";
  ASSERT_EQ(chmod(secret.c_str(), 0600), 0);
  // The remote shell's mktemp uses TMPDIR too: anything left shows there.
  const RunResult result = run_ronderun(
      {"-H",
       "hostA:1,hostB:1",
       "--host",
       "127.0.0.1",
       "--rsh",
       kFakeRsh,
       "--",
       "sh",
       "-c",
       "echo \"$FAKE_HOST $RONDE_JOB_SECRET_FILE "
       "$(stat -L -c %a $RONDE_JOB_SECRET_FILE) "
       "$(cat $RONDE_JOB_SECRET_FILE)\""},
      {{"TMPDIR", temp_dir_}, {"RONDE_JOB_SECRET_FILE", secret}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(
      line_set(result.out),
      (std::set<std::string>{
          "[0] hostA /dev/fd/3 600 a job secret, given by file",
          "[1] hostB /dev/fd/3 600 a job secret, given by file"}));
  EXPECT_EQ(other_entries(temp_dir_, "secret"), std::vector<std::string>{})
      << "left behind";
}

TEST_F(RonderunTest, ReadsAHostfileAndFillsHostsInOrder) {
  const std::string path = temp_file("hosts");
  std::ofstream(path) << "# two hosts\n"
                      << "hostA slots=1\n\n"
                      << "hostB:2  # trailing comment\n";
  const RunResult result = run_ronderun(
      {"--hostfile",
       path,
       "-np",
       "2",
       "--host",
       "127.0.0.1",
       "--rsh",
       kFakeRsh,
       "--",
       "sh",
       "-c",
       "echo $FAKE_HOST $RONDE_LOCAL_SIZE"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::set<std::string> lines = line_set(result.out);
  EXPECT_EQ(lines, (std::set<std::string>{"[0] hostA 1", "[1] hostB 1"}));
}

TEST_F(RonderunTest, StopsAMultiHostJobWhenAHostsCommandDies) {
  const auto start = Clock::now();
  const RunResult result = run_ronderun(
      {"-H",
       "hostA:1,hostB:1",
       "--host",
       "127.0.0.1",
       "--rsh",
       kFakeRsh,
       "--",
       "sh",
       "-c",
       "if [ $FAKE_HOST = hostB ]; then exit 9; fi; sleep 60"});
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 9) << result.err;
  EXPECT_LT(seconds, kTimeoutSeconds);
}

TEST_F(RonderunTest, RefusesAFirstHostItCannotResolve) {
  const RunResult result = run_ronderun(
      {"-H",
       "no-such-host.invalid:1,other.invalid:1",
       "--rsh",
       kFakeRsh,
       "--",
       "true"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_TRUE(contains(
      result.err,
      "cannot resolve the first host "
      "'no-such-host.invalid'"))
      << result.err;
  EXPECT_TRUE(contains(result.err, "--host")) << result.err;
}

TEST_F(RonderunTest, RunsLocalhostEntriesWithoutTheTemplate) {
  const RunResult result = run_ronderun(
      {"-H",
       "localhost:2",
       "--rsh",
       "false",
       "--",
       "sh",
       "-c",
       "echo $RONDE_RENDEZVOUS_ADDR $RONDE_LOCAL_SIZE"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::set<std::string> lines = line_set(result.out);
  EXPECT_EQ(
      lines, (std::set<std::string>{"[0] 127.0.0.1 2", "[1] 127.0.0.1 2"}));
}

std::string read_whole(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(TimelineMerge, TellsCompleteEventsFromTornOnes) {
  EXPECT_TRUE(complete_event(R"({"name":"a","ts":1,"args":{"b":[1,2]}})"));
  EXPECT_TRUE(complete_event(R"({"name":"a}{","ts":1},)"));
  EXPECT_TRUE(complete_event(R"({"name":"q\"}","ts":1})"));
  EXPECT_FALSE(complete_event(R"({"name":"a","args":{"b":1})"));
  EXPECT_FALSE(complete_event(R"({"name":"a","ts)"));
  EXPECT_FALSE(complete_event(R"({"a":1}{"b":2})"));
  EXPECT_FALSE(complete_event("["));
  EXPECT_FALSE(complete_event(""));
}

// Rank 0 writes a whole timeline, rank 1 is torn mid-event, rank 2 writes
// none: the merged file holds every complete event, one track per rank.
TEST_F(RonderunTest, MergesTheRanksTimelines) {
  const std::string dir = temp_dir_ + "/timeline";
  const RunResult result = run_ronderun(
      {"-np",
       "3",
       "--timeline",
       dir,
       "--",
       "sh",
       "-c",
       "f=$(printf %s \"$RONDE_TIMELINE\" | sed \"s/{rank}/$RONDE_RANK/\"); "
       "case $RONDE_RANK in "
       "0) printf '[\\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,"
       "\"args\":{\"name\":\"rank 0\"}},\\n{\"name\":\"a\",\"ph\":\"X\","
       "\"ts\":1,\"dur\":2,\"pid\":0,\"tid\":1}\\n]\\n' > \"$f\";; "
       "1) printf '[\\n{\"name\":\"b\",\"ph\":\"X\",\"ts\":3,\"dur\":1,"
       "\"pid\":1,\"tid\":1},\\n{\"name\":\"c\",\"ph\":\"X\",\"du' "
       "> \"$f\";; esac"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string merged = read_whole(dir + "/timeline.json");
  EXPECT_EQ(
      merged.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0), 0u)
      << merged;
  EXPECT_TRUE(contains(merged, R"("name":"a","ph":"X","ts":1)")) << merged;
  EXPECT_TRUE(contains(merged, R"("name":"b","ph":"X","ts":3)")) << merged;
  EXPECT_FALSE(contains(merged, R"("name":"c")")) << merged;
  EXPECT_TRUE(
      contains(merged, R"("name":"process_sort_index","ph":"M","pid":1)"))
      << merged;
  EXPECT_TRUE(contains(merged, "\n]}\n")) << merged;
  EXPECT_TRUE(contains(
      result.err,
      "timeline of 2 rank(s) in " + dir + "/timeline.json (5 events)"))
      << result.err;
  EXPECT_TRUE(contains(result.err, "no file from rank(s) 2")) << result.err;
  EXPECT_TRUE(contains(result.err, "timeline.1.json ends mid-event"))
      << result.err;

  // The same files merged by hand, as for a job another launcher started.
  const std::string out = temp_dir_ + "/by_hand.json";
  const RunResult by_hand = run_ronderun(
      {"--merge-timelines",
       out,
       dir + "/timeline.0.json",
       dir + "/timeline.1.json"});
  EXPECT_EQ(by_hand.exit_code, 0) << by_hand.err;
  EXPECT_EQ(read_whole(out), merged);
  const RunResult missing =
      run_ronderun({"--merge-timelines", out, dir + "/timeline.2.json"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_TRUE(contains(missing.err, "cannot read " + dir + "/timeline.2.json"))
      << missing.err;
  for (const char* f : {"timeline.0.json", "timeline.1.json", "timeline.json"})
    (void)unlink((dir + "/" + f).c_str());
  (void)rmdir(dir.c_str());
  (void)unlink(out.c_str());
}

}  // namespace
}  // namespace detail
}  // namespace ronde
