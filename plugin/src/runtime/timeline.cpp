#include <ronde/runtime.h>
#include <ronde/timeline.h>

#include "runtime/json_text.h"
#include "runtime/launch_contract.h"
#include "runtime/span.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace ronde {

namespace {

// Wall-clock microseconds, so that the files of several ranks (and
// machines with synchronised clocks) line up when opened together.
using Clock = std::chrono::system_clock;

thread_local std::string t_track;

struct Timeline {
  std::mutex mu;
  std::atomic<bool> on{false};
  FILE* file = nullptr;
  std::string path;
  int pid = 0;  // the rank, as the trace's process id
  std::unordered_map<std::thread::id, int> tids;
  bool first = true;

  // Call with mu held.
  int tid_locked() {
    auto id = std::this_thread::get_id();
    auto it = tids.find(id);
    if (it != tids.end()) {
      return it->second;
    }
    int tid = static_cast<int>(tids.size()) + 1;
    tids.emplace(id, tid);
    std::ostringstream meta;
    meta << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid
         << ",\"tid\":" << tid << ",\"args\":{\"name\":\""
         << (t_track.empty() ? "thread " + std::to_string(tid) : t_track)
         << "\"}}";
    write_locked(meta.str());
    return tid;
  }
  void write_locked(const std::string& event) {
    if (file == nullptr) {
      return;
    }
    std::fputs(first ? "[\n" : ",\n", file);
    first = false;
    std::fputs(event.c_str(), file);
  }
};

Timeline& timeline() {
  static Timeline* t = new Timeline();  // outlives static destructors
  return *t;
}

std::string rank_path(const std::string& path, int rank, int size) {
  std::string p = path;
  if (detail::substitute_rank(p, rank)) {
    return p;
  }
  if (size <= 1) {
    return p;
  }
  auto slash = p.rfind('/');
  auto dot = p.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return p + "." + std::to_string(rank);
  }
  return p.substr(0, dot) + "." + std::to_string(rank) + p.substr(dot);
}

void close_locked(Timeline& t) {
  if (t.file != nullptr) {
    std::fputs(t.first ? "[\n]\n" : "\n]\n", t.file);
    std::fclose(t.file);
    t.file = nullptr;
  }
  t.on = false;
}

}  // namespace

void start_timeline(const std::string& path) {
  TORCH_CHECK(!path.empty(), "start_timeline: the path is empty");
  Timeline& t = timeline();
  std::lock_guard<std::mutex> lock(t.mu);
  close_locked(t);
  const int rank = is_initialized() ? ronde::rank() : 0;
  const int size = is_initialized() ? ronde::size() : 1;
  t.path = rank_path(path, rank, size);
  t.file = std::fopen(t.path.c_str(), "w");
  TORCH_CHECK(
      t.file != nullptr,
      "ronde: rank ",
      rank,
      " cannot open the timeline file '",
      t.path,
      "': ",
      std::strerror(errno));
  t.pid = rank;
  t.first = true;
  t.tids.clear();
  std::ostringstream meta;
  meta << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank
       << ",\"args\":{\"name\":\"rank " << rank << "\"}}";
  t.write_locked(meta.str());
  t.on = true;
}

void stop_timeline() {
  Timeline& t = timeline();
  std::lock_guard<std::mutex> lock(t.mu);
  close_locked(t);
}

bool timeline_enabled() {
  return timeline().on.load(std::memory_order_relaxed);
}

std::string timeline_path() {
  Timeline& t = timeline();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.on ? t.path : "";
}

namespace detail {

int64_t timeline_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             Clock::now().time_since_epoch())
      .count();
}

void timeline_span(
    const std::string& name,
    const char* category,
    int64_t start_us,
    int64_t end_us,
    const std::string& args_json) {
  Timeline& t = timeline();
  if (!t.on.load(std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard<std::mutex> lock(t.mu);
  std::ostringstream e;
  e << "{\"name\":\"" << detail::json_escape(name) << "\",\"cat\":\""
    << category << "\",\"ph\":\"X\",\"ts\":" << start_us
    << ",\"dur\":" << std::max<int64_t>(0, end_us - start_us)
    << ",\"pid\":" << t.pid << ",\"tid\":" << t.tid_locked();
  if (!args_json.empty()) {
    e << ",\"args\":{" << args_json << "}";
  }
  e << "}";
  t.write_locked(e.str());
}

void timeline_instant(
    const std::string& name,
    const char* category,
    const std::string& args_json) {
  Timeline& t = timeline();
  if (!t.on.load(std::memory_order_relaxed)) {
    return;
  }
  const int64_t now = timeline_now_us();
  std::lock_guard<std::mutex> lock(t.mu);
  std::ostringstream e;
  e << "{\"name\":\"" << detail::json_escape(name) << "\",\"cat\":\""
    << category << "\",\"ph\":\"i\",\"s\":\"t\",\"ts\":" << now
    << ",\"pid\":" << t.pid << ",\"tid\":" << t.tid_locked();
  if (!args_json.empty()) {
    e << ",\"args\":{" << args_json << "}";
  }
  e << "}";
  t.write_locked(e.str());
}

void timeline_thread_name(const std::string& name) {
  t_track = name;
}

}  // namespace detail

TimelineRange::TimelineRange(std::string name, std::string category)
    : category_(std::move(category)) {
  // The span of ronde's own work, under the caller's name: nothing is
  // allocated while neither the timeline nor a profiler records.
  if (timeline_enabled() || at::hasCallbacks()) {
    span_ = std::make_unique<detail::Span>(name, name, category_.c_str());
  }
}

TimelineRange::~TimelineRange() = default;

}  // namespace ronde
