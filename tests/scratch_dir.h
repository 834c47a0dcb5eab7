// Scratch directories of the test programs (shared-memory segment
// directories under /dev/shm, rendezvous directories under /tmp), named for
// the process that made them: PREFIX.PID.XXXXXX. A test program killed
// before its own cleanup (a signal, a broken pipe, ctest's timeout) cannot
// remove its directories, so each new one first removes those with the same
// parent and prefix whose process is gone.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace ronde::testing {

// A fresh directory `under`/`prefix`.PID.XXXXXX, or "" when it cannot be
// made.
inline std::string make_scratch_dir(
    const std::string& under, const std::string& prefix) {
  namespace fs = std::filesystem;
  const std::string lead = prefix + ".";
  std::vector<fs::path> stale;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(under, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(lead, 0) != 0)
      continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + lead.size(), &end, 10);
    // Gone: no such process (a process of another user answers EPERM).
    if (pid > 0 && *end == '.' && pid != ::getpid() &&
        ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      stale.push_back(e.path());
  }
  for (const fs::path& p : stale)
    fs::remove_all(p, ec);  // best effort: another program may sweep too
  std::string tmpl =
      under + "/" + lead + std::to_string(::getpid()) + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    return "";
  return buf.data();
}

}  // namespace ronde::testing
