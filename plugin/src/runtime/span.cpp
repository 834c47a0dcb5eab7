#include "runtime/span.h"

#include <ronde/timeline.h>

namespace ronde::detail {

Span::Span(std::string_view range) {
  if (timeline_enabled())
    start_us_ = timeline_now_us();
  if (at::hasCallbacks()) {
    range_.emplace(at::RecordScope::USER_SCOPE);
    if (range_->isActive())
      range_->before(range);
  }
}

Span::Span(std::string_view range, std::string name, const char* category)
    : Span(range) {
  if (start_us_ >= 0) {
    name_ = std::move(name);
    category_ = category;
  }
}

Span::~Span() {
  if (category_ != nullptr)
    timeline(name_, category_);
}

void Span::timeline(
    const std::string& name,
    const char* category,
    const std::string& args_json) const {
  if (start_us_ >= 0)
    timeline_span(name, category, start_us_, timeline_now_us(), args_json);
}

std::shared_ptr<const ProfilerContext> ProfilerContext::capture() {
  // Global callbacks reach every thread already; only this thread's need
  // carrying.
  if (!at::hasThreadLocalCallbacks())
    return nullptr;
  auto context = std::make_shared<ProfilerContext>();
  context->callbacks_ = at::get_record_function_tls_();
  context->info_ = c10::ThreadLocalDebugInfo::current();
  return context;
}

ProfilerContext::Scope::Scope(const ProfilerContext* context) {
  if (context == nullptr)
    return;
  saved_ = at::get_record_function_tls_();
  at::set_record_function_tls_(context->callbacks_);
  // The profiler keeps its state in the thread's debug info.
  info_.emplace(context->info_);
  applied_ = true;
}

ProfilerContext::Scope::~Scope() {
  if (!applied_)
    return;
  info_.reset();
  at::set_record_function_tls_(saved_);
}

}  // namespace ronde::detail
