// A Chrome-trace timeline per rank: what ronde did when (gradient hooks,
// bucket packing, all-reduces, waiting, optimizer steps, checkpoints), to
// open in Perfetto (ui.perfetto.dev) or chrome://tracing.
//
// RONDE_TIMELINE=timeline.json at init() starts it for the whole run; each
// rank writes its own file ("{rank}" in the path is replaced by the rank,
// else ".<rank>" goes before the extension when there are several ranks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace ronde {

namespace detail {
class Span;
}  // namespace detail

// Starts writing the timeline to `path` (replacing a running one). Safe to
// call before init(): the file is then named for rank 0.
void start_timeline(const std::string& path);
// Writes what is buffered and closes the file. shutdown() calls it.
void stop_timeline();
bool timeline_enabled();
// The file being written, or "".
std::string timeline_path();

// A span of your own on the timeline, on the calling thread's track, and a
// range of the same name in the PyTorch profiler while one records:
//   { ronde::TimelineRange r("data loading"); loader.next(); }
class TimelineRange {
 public:
  explicit TimelineRange(std::string name, std::string category = "user");
  ~TimelineRange();
  TimelineRange(const TimelineRange&) = delete;
  TimelineRange& operator=(const TimelineRange&) = delete;

 private:
  std::string category_;
  // Null: neither the timeline nor a profiler recorded at construction.
  // After category_, which it points into, so that it ends first.
  std::unique_ptr<detail::Span> span_;
};

namespace detail {
// Microseconds on the timeline's clock.
int64_t timeline_now_us();
// A complete event ("X") on the calling thread's track; args_json is a JSON
// object body without braces ("\"bytes\":1024"), or empty.
void timeline_span(
    const std::string& name,
    const char* category,
    int64_t start_us,
    int64_t end_us,
    const std::string& args_json = "");
// An instant event ("i") on the calling thread's track.
void timeline_instant(
    const std::string& name,
    const char* category,
    const std::string& args_json = "");
// Names the calling thread's track ("communication"); call it before the
// thread's first event.
void timeline_thread_name(const std::string& name);
}  // namespace detail

}  // namespace ronde
