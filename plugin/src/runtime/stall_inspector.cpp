#include "runtime/stall_inspector.h"

#include "runtime/records.h"
#include "runtime/rendezvous.h"
#include "runtime/signed_store.h"

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

StallOptions stall_options(const Settings& settings) {
  StallOptions o;
  if (settings.stall_warning_seconds)
    o.warning_seconds = *settings.stall_warning_seconds;
  if (settings.stall_shutdown_seconds)
    o.shutdown_seconds = *settings.stall_shutdown_seconds;
  return o;
}

StallInspector::StallInspector(
    c10::intrusive_ptr<c10d::Store> store,
    LaunchInfo info,
    StallOptions options,
    StallWatch watch)
    : store_(std::move(store)),
      info_(std::move(info)),
      options_(options),
      watch_(std::move(watch)) {
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

std::optional<std::string> StallInspector::read_value(const std::string& key) {
  try {
    return as_string(store_->get(key));
  } catch (const RefusedStoreValue& e) {
    if (refused_keys_.insert(key).second) {
      std::cerr << "ronde: rank " << info_.rank << ": ignoring " << e.what()
                << std::endl;
    }
    return std::nullopt;
  }
}

void StallInspector::report_refused() {
  const int64_t n = refused_count(*store_);
  if (n <= refused_reported_)
    return;
  std::cerr << "ronde: warning: rank 0: refused "
            << (n - refused_reported_ == 1
                    ? std::string("a process")
                    : std::to_string(n - refused_reported_) + " processes")
            << " that tried to join the store of job '" << info_.job_id
            << "' at " << info_.addr << ":" << info_.port
            << " (another job, no job secret, or another secret); the job "
               "goes on"
            << std::endl;
  refused_reported_ = n;
}

std::string StallInspector::describe_missing(int64_t started) {
  std::vector<int> missing;
  std::ostringstream last;
  for (int r = 0; r < info_.size; ++r) {
    if (r == info_.rank) {
      continue;
    }
    const std::string key = job_key(info_, "progress/" + std::to_string(r));
    int64_t theirs = 0;
    std::string what = "nothing yet";
    if (store_->check({key})) {
      auto v = read_value(key);
      auto p = v ? decode_progress(*v) : std::nullopt;
      if (p) {
        theirs = p->started;
        what = p->what;
      } else {
        what = "(its progress record is unreadable)";
      }
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
        lock.unlock();
        // Refusals since the last look are reported before the job ends.
        if (info_.rank == 0)
          report_refused();
        return;
      }
    }
    try {
      // Another rank gave up on a stall: close this rank's connections too,
      // which is what wakes the collectives blocked on them everywhere.
      const std::string abort_key = job_key(info_, "stall_shutdown");
      if (!interrupted && store_->check({abort_key})) {
        if (auto why = read_value(abort_key)) {
          std::cerr << "ronde: rank " << info_.rank
                    << ": closing connections: " << *why << std::endl;
          watch_.interrupt();
          interrupted = true;
        }
      }
      if (info_.rank == 0)
        report_refused();
      auto p = watch_.progress();
      if (p.started != published) {
        std::string v = encode_progress({p.started, p.what});
        store_->set(
            job_key(info_, "progress/" + std::to_string(info_.rank)),
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
          std::cerr << "ronde: stall warning: rank " << info_.rank
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
        why << "rank " << info_.rank << " gave up after "
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
        store_->set(abort_key, std::vector<uint8_t>(v.begin(), v.end()));
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
