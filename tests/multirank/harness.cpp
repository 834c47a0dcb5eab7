// See harness.h. Each rank writes to its own log file, so a rank that dies
// mid-line loses nothing and outputs never interleave.
#include "harness.h"

#include "crash_signals.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ronde::testing {

std::string JobResult::dump() const {
  std::ostringstream os;
  if (timed_out)
    os << "*** job timed out ***\n";
  for (const auto& r : ranks) {
    os << "--- rank " << r.rank << ": ";
    if (r.signal != 0) {
      os << "killed by signal " << r.signal;
    } else {
      os << "exit " << r.exit_code;
    }
    os << " ---\n" << r.output << "\n";
  }
  return os.str();
}

bool JobResult::all_succeeded() const {
  if (timed_out)
    return false;
  for (const auto& r : ranks) {
    if (r.signal != 0 || r.exit_code != 0)
      return false;
  }
  return true;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    throw std::runtime_error("bind() failed");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::string unique_job_id() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  std::ostringstream os;
  os << "test-" << ::getpid() << "-" << counter++ << "-" << std::hex << rd();
  return os.str();
}

namespace {

bool keep_temp_dirs() {
  const char* keep = std::getenv("RONDE_TEST_KEEP_DIRS");
  return keep != nullptr && *keep != '\0' && std::string(keep) != "0";
}

// Directories from make_temp_dir(), removed when the test program exits
// (only by the process that made them: a forked child exits too).
struct TempDirRegistry {
  std::mutex mutex;
  std::vector<std::string> dirs;
  pid_t owner = ::getpid();
  ~TempDirRegistry() {
    if (::getpid() != owner)
      return;
    for (const auto& d : dirs)
      remove_temp_dir(d);
  }
};

TempDirRegistry& registry() {
  static TempDirRegistry r;
  return r;
}

}  // namespace

std::string make_temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(base && *base ? base : "/tmp") + "/ronde-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed");
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.dirs.push_back(buf.data());
  return buf.data();
}

void remove_temp_dir(const std::string& dir) {
  if (dir.empty() || keep_temp_dirs())
    return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // best effort: only a test's files
}

std::string worker_path() {
#ifdef RONDE_TEST_WORKER
  return RONDE_TEST_WORKER;
#else
  return "ronde_test_worker";
#endif
}

JobSpec worker_spec(
    std::vector<std::string> args, int np, const std::string& program) {
  JobSpec s;
  s.argv = {program};
  s.argv.insert(s.argv.end(), args.begin(), args.end());
  s.np = np;
  return s;
}

RunningJob::RunningJob(JobSpec spec) : spec_(std::move(spec)) {
  if (spec_.job_id.empty())
    spec_.job_id = unique_job_id();
  if (spec_.port == 0)
    spec_.port = free_port();
  ranks_ = spec_.only_ranks;
  if (ranks_.empty()) {
    for (int r = 0; r < spec_.np; ++r)
      ranks_.push_back(r);
  }
  dir_ = make_temp_dir();
  const std::string& dir = dir_;
  start_ = std::chrono::steady_clock::now();
  for (int r : ranks_) {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      auto eq = kv.find('=');
      if (eq != std::string::npos)
        env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["RONDE_RANK"] = std::to_string(r);
    env["RONDE_SIZE"] = std::to_string(spec_.np);
    env["RONDE_LOCAL_RANK"] = std::to_string(r);
    env["RONDE_LOCAL_SIZE"] = std::to_string(spec_.np);
    env["RONDE_RENDEZVOUS_ADDR"] = "127.0.0.1";
    env["RONDE_RENDEZVOUS_PORT"] = std::to_string(spec_.port);
    env["RONDE_JOB_ID"] = spec_.job_id;
    // Two ranks share two cores: one intra-op thread each avoids thrashing.
    env["OMP_NUM_THREADS"] = "1";
    for (const auto& [k, v] : spec_.env)
      env[k] = v;

    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env)
      env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = spec_.argv;
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);

    std::string log = dir + "/rank" + std::to_string(r) + ".log";
    logs_.push_back(log);
    pid_t pid = ::fork();
    if (pid < 0)
      throw std::runtime_error("fork failed");
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::setpgid(0, 0);
      ::execve(argv[0], argv.data(), envp.data());
      std::fprintf(
          stderr, "exec %s failed: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    pids_.push_back(pid);
  }
}

RunningJob::~RunningJob() {
  if (!waited_) {
    for (int pid : pids_)
      ::kill(-pid, SIGKILL);
    for (int pid : pids_)
      ::waitpid(pid, nullptr, 0);
    remove_temp_dir(dir_);  // wait() removes it otherwise
  }
}

JobResult RunningJob::wait() {
  JobResult result;
  const size_t n = pids_.size();
  std::vector<int> status(n, 0);
  std::vector<bool> done(n, false);
  size_t remaining = n;
  auto deadline = start_ + spec_.timeout;
  while (remaining > 0) {
    for (size_t i = 0; i < n; ++i) {
      if (done[i])
        continue;
      int st = 0;
      pid_t rc = ::waitpid(pids_[i], &st, WNOHANG);
      if (rc == pids_[i]) {
        done[i] = true;
        status[i] = st;
        --remaining;
        const bool crashed = WIFSIGNALED(st) && is_crash_signal(WTERMSIG(st));
        if (crashed && spec_.crash_grace.count() > 0) {
          deadline = std::min(
              deadline, std::chrono::steady_clock::now() + spec_.crash_grace);
        }
      }
    }
    if (remaining == 0)
      break;
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      for (size_t i = 0; i < n; ++i) {
        if (!done[i])
          ::kill(-pids_[i], SIGKILL);
      }
      for (size_t i = 0; i < n; ++i) {
        if (!done[i])
          ::waitpid(pids_[i], &status[i], 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Grandchildren share each rank's process group; none may outlive it.
  for (size_t i = 0; i < n; ++i)
    ::kill(-pids_[i], SIGKILL);
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
          .count();
  for (size_t i = 0; i < n; ++i) {
    RankResult r;
    r.rank = ranks_[i];
    if (WIFSIGNALED(status[i])) {
      r.signal = WTERMSIG(status[i]);
    } else {
      r.exit_code = WEXITSTATUS(status[i]);
    }
    std::ifstream in(logs_[i]);
    std::stringstream ss;
    ss << in.rdbuf();
    r.output = ss.str();
    result.ranks.push_back(std::move(r));
  }
  // The logs now live in the result (and in a failed test's message).
  remove_temp_dir(dir_);
  waited_ = true;
  return result;
}

JobResult run_job(JobSpec spec) {
  RunningJob job(std::move(spec));
  return job.wait();
}

}  // namespace ronde::testing
