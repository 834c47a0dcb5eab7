// What ronde does, seen from outside: a span on ronde's own timeline
// (RONDE_TIMELINE) and a range in the PyTorch profiler (torch.profiler,
// torch::autograd::profiler) when one records this thread. With neither on,
// a span costs a clock-free check of each.
#pragma once

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace ronde::detail {

class Span {
 public:
  // `range`: the profiler range's name (copied), ronde's own a literal
  // ("ronde::pack"): ranges of one kind share a name, so that profiler
  // tables add them up.
  explicit Span(std::string_view range);
  // A span that writes itself on the timeline, as `name`, when it ends;
  // `category` must outlive it.
  Span(std::string_view range, std::string name, const char* category);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  // Whether the timeline records this span: build its name only then.
  bool timing() const {
    return start_us_ >= 0;
  }
  // When the span began on the timeline's clock (-1: not timing).
  int64_t start_us() const {
    return start_us_;
  }
  // Writes the span, from construction to now, on the timeline as `name`
  // (`args_json` as in timeline_span); the profiler range ends with the
  // object.
  void timeline(
      const std::string& name,
      const char* category,
      const std::string& args_json = "") const;

 private:
  int64_t start_us_ = -1;
  std::string name_;
  const char* category_ = nullptr;  // set: written when destroyed
  std::optional<at::RecordFunction> range_;
};

// The profiler of the thread that queues a job, carried to the thread that
// runs it (ronde's communication thread), as autograd carries it to its
// own: the job's ranges then land in the same trace.
class ProfilerContext {
 public:
  // Null when no profiler records the calling thread: nothing to carry.
  static std::shared_ptr<const ProfilerContext> capture();

  // Applies a captured context to the calling thread until destroyed;
  // a null one changes nothing.
  class Scope {
   public:
    explicit Scope(const ProfilerContext* context);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    bool applied_ = false;
    at::RecordFunctionTLS saved_;
    std::optional<c10::DebugInfoGuard> info_;
  };

 private:
  at::RecordFunctionTLS callbacks_;
  std::shared_ptr<c10::ThreadLocalDebugInfo> info_;
};

}  // namespace ronde::detail
