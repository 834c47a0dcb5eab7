// Finding, starting and stopping ronde_store.
#include "store_host.h"

#include "runtime/posix_io.h"

#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

namespace ronde::detail {
namespace {

bool executable(const std::string& path) {
  return access(path.c_str(), X_OK) == 0;
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

std::string find_store_program(const std::string& self) {
  const std::string dir = dir_of(self);
  if (executable(dir + "/ronde_store")) {
    return dir + "/ronde_store";
  }
  // A wheel installs ronderun among the scripts (<env>/bin) and the store
  // host in the package (<env>/lib/pythonX.Y/site-packages/ronde/lib).
  glob_t found{};
  std::string program;
  const std::string pattern =
      dir + "/../lib/python*/site-packages/ronde/lib/ronde_store";
  if (glob(pattern.c_str(), 0, nullptr, &found) == 0) {
    for (size_t i = 0; i < found.gl_pathc && program.empty(); ++i) {
      if (executable(found.gl_pathv[i])) {
        program = found.gl_pathv[i];
      }
    }
  }
  globfree(&found);
  return program;
}

std::string StoreHost::start(
    const std::string& program, int port, int timeout_ms) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return "cannot make a pipe for the store host: " + errno_text();
  }
  const std::string port_text = std::to_string(port);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return "cannot fork the store host: " + errno_text();
  }
  if (pid == 0) {
    setpgid(0, 0);  // the terminal's Ctrl-C reaches the ranks, not it
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], STDOUT_FILENO);
    execl(
        program.c_str(),
        program.c_str(),
        "--port",
        port_text.c_str(),
        static_cast<char*>(nullptr));
    _exit(127);
  }
  pid_ = pid;
  close(out[1]);
  // "ready PORT\n" once it serves.
  std::string line;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) {
      continue;
    }
    if (ready <= 0) {
      break;
    }
    char buffer[64];
    const ssize_t n = read(out[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    line.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  if (line.rfind("ready ", 0) != 0) {
    stop();
    return "the store host " + program + " did not start serving on port " +
           port_text + " (its message, if any, is above)";
  }
  return "";
}

void StoreHost::stop() {
  if (pid_ <= 0) {
    return;
  }
  kill(pid_, SIGTERM);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
}

}  // namespace ronde::detail
