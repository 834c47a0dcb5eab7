// The store host of an elastic job: ronderun starts ronde_store before the
// ranks and stops it after them, so the store outlives every rank.
#pragma once

#include <sys/types.h>

#include <string>

namespace ronde::detail {

// Where ronde_store is: beside `self` (ronderun's own path: a build tree,
// an installed prefix), else in the ronde package of a pip install into the
// environment `self` belongs to. Empty when neither has it.
std::string find_store_program(const std::string& self);

class StoreHost {
 public:
  StoreHost() = default;
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;
  ~StoreHost() {
    stop();
  }

  // Starts `program --port port` in a process group of its own and waits
  // up to `timeout_ms` until it serves; an error message instead.
  std::string start(const std::string& program, int port, int timeout_ms);
  // SIGTERM, then SIGKILL after two seconds; reaps it. Nothing if not
  // running.
  void stop();
  pid_t pid() const {
    return pid_;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace ronde::detail
