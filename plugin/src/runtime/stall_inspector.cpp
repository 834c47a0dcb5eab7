#include "runtime/stall_inspector.h"

#include "runtime/launch_env.h"
#include "runtime/runtime_state.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <vector>

namespace ronde::detail {

namespace {

using Clock = std::chrono::steady_clock;

std::string as_string(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

}  // namespace

StallOptions stall_options_from_env() {
  StallOptions o;
  if (auto w = positive_env_number("RONDE_STALL_WARNING_SECONDS", "seconds")) {
    o.warning_seconds = *w;
  }
  if (auto s = positive_env_number("RONDE_STALL_SHUTDOWN_SECONDS", "seconds")) {
    o.shutdown_seconds = *s;
  }
  return o;
}

StallInspector::StallInspector(Runtime& rt, StallOptions options)
    : rt_(rt), options_(options) {
  thread_ = std::thread([this] { loop(); });
}

StallInspector::~StallInspector() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

std::string StallInspector::describe_missing(int64_t started) {
  std::vector<int> missing;
  std::ostringstream last;
  for (int r = 0; r < rt_.info.size; ++r) {
    if (r == rt_.info.rank) {
      continue;
    }
    const std::string key = rt_.key("progress/" + std::to_string(r));
    int64_t theirs = 0;
    std::string what = "nothing yet";
    if (rt_.store->check({key})) {
      std::string v = as_string(rt_.store->get(key));
      auto bar = v.find('|');
      theirs = std::stoll(v.substr(0, bar));
      what = bar == std::string::npos ? "" : v.substr(bar + 1);
    }
    if (theirs < started) {
      missing.push_back(r);
      last << (missing.size() > 1 ? "; " : "") << "rank " << r
           << " last started #" << theirs << " " << what;
    }
  }
  if (missing.empty()) {
    return "";
  }
  std::ostringstream out;
  out << (missing.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < missing.size(); ++i) {
    out << (i ? ", " : "") << missing[i];
  }
  out << (missing.size() == 1 ? " has" : " have") << " not submitted it ("
      << last.str() << ")";
  return out.str();
}

void StallInspector::loop() {
  const auto period = std::chrono::milliseconds(static_cast<int64_t>(
      std::clamp(options_.warning_seconds / 4, 0.05, 1.0) * 1000));
  int64_t published = -1;
  int64_t warned = -1;
  bool interrupted = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (cv_.wait_for(lock, period, [&] { return stopping_; })) {
        return;
      }
    }
    try {
      // Another rank gave up on a stall: close this rank's connections too,
      // which is what wakes the collectives blocked on them everywhere.
      const std::string abort_key = rt_.key("stall_shutdown");
      if (!interrupted && rt_.store->check({abort_key})) {
        std::cerr << "ronde: rank " << rt_.info.rank
                  << ": closing connections: "
                  << as_string(rt_.store->get(abort_key)) << std::endl;
        rt_.comm->interrupt();
        interrupted = true;
      }
      auto p = rt_.worker->progress();
      if (p.started != published) {
        std::string v = std::to_string(p.started) + "|" + p.what;
        rt_.store->set(
            rt_.key("progress/" + std::to_string(rt_.info.rank)),
            std::vector<uint8_t>(v.begin(), v.end()));
        published = p.started;
      }
      if (!p.running) {
        continue;
      }
      const double waited =
          std::chrono::duration<double>(Clock::now() - p.since).count();
      if (waited >= options_.warning_seconds && warned != p.started) {
        std::string missing = describe_missing(p.started);
        if (!missing.empty()) {
          std::cerr << "ronde: stall warning: rank " << rt_.info.rank
                    << " has waited " << static_cast<int64_t>(waited)
                    << " s in collective #" << p.started << " " << p.what
                    << "; " << missing << std::endl;
          warned = p.started;
        }
      }
      if (options_.shutdown_seconds > 0 &&
          waited >= options_.shutdown_seconds && !interrupted) {
        std::string missing = describe_missing(p.started);
        std::ostringstream why;
        why << "rank " << rt_.info.rank << " gave up after "
            << static_cast<int64_t>(waited) << " s in collective #" << p.started
            << " " << p.what
            << " (RONDE_STALL_SHUTDOWN_SECONDS=" << options_.shutdown_seconds
            << ")" << (missing.empty() ? "" : "; " + missing);
        std::cerr << "ronde: stall: " << why.str() << std::endl;
        // Every other rank's inspector sees this and closes its
        // connections, which fails this rank's blocked collective: closing
        // its own would not (a closed connection no longer reports the
        // peer's end), so this rank keeps its side open.
        std::string v = why.str();
        rt_.store->set(abort_key, std::vector<uint8_t>(v.begin(), v.end()));
        interrupted = true;
      }
    } catch (const std::exception& e) {
      // The store is gone (rank 0 exited) or unreachable: nothing left to
      // inspect; the collectives' own timeout still applies. The thread
      // still ends only when the destructor stops and joins it (never a
      // finished thread nobody joins).
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_; });
      return;
    }
  }
}

}  // namespace ronde::detail
