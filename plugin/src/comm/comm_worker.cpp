// The communication thread and the Handle that waits on its jobs.
#include "comm/comm_worker.h"

#include "comm/communicator.h"

#include <ronde/errors.h>
#include <ronde/timeline.h>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <thread>

namespace ronde {
namespace {

// Polls device work on the host until it finishes (true) or `deadline`
// passes (false); a failure reported by the backend is rethrown.
bool poll_device(
    detail::DeviceWork& work,
    std::optional<std::chrono::steady_clock::time_point> deadline) {
  for (;;) {
    if (work.query())
      return true;
    if (deadline && std::chrono::steady_clock::now() >= *deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The worker whose job this thread is executing: a collective that job
// submits to the same worker (a communication hook's) runs at once, inside
// it, where queueing would wait on itself.
thread_local const detail::CommWorker* executing = nullptr;

}  // namespace

Handle::Handle(std::shared_ptr<detail::HandleState> state)
    : state_(std::move(state)) {}

bool Handle::done() const {
  TORCH_CHECK(state_ != nullptr, "ronde: done() on an empty Handle");
  std::shared_ptr<detail::DeviceWork> device;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->done)
      return false;
    if (state_->error)
      return true;
    device = state_->device;
  }
  if (!device)
    return true;
  try {
    return device->query();
  } catch (...) {
    return true;  // finished, badly: wait() raises it
  }
}

void Handle::wait() const {
  TORCH_CHECK(state_ != nullptr, "ronde: wait() on an empty Handle");
  detail::CommWorker::help(*state_);
  std::shared_ptr<detail::DeviceWork> device;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->done; });
    if (state_->error)
      std::rethrow_exception(state_->error);
    device = state_->device;
  }
  if (!device)
    return;
  // RONDE_BLOCKING_WAIT=1: block the host until the device finished it (and
  // raise its failure in this call) instead of ordering the caller's stream
  // after it.
  if (state_->blocking_wait) {
    poll_device(*device, std::nullopt);  // the watchdog bounds it
    return;
  }
  // Whatever this thread enqueues next on the device runs after the
  // collective; the host goes on at once. The result is recorded on the
  // waiting stream too, so its memory outlives that stream's use of it when
  // it is not the stream that submitted the collective.
  const c10::Stream waiter = device->block_current();
  const at::Tensor& result = state_->result;
  if (result.defined() && result.device() == waiter.device())
    result.record_stream(waiter);
}

bool Handle::wait(std::chrono::milliseconds timeout) const {
  TORCH_CHECK(state_ != nullptr, "ronde: wait() on an empty Handle");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::shared_ptr<detail::DeviceWork> device;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) {
      return false;
    }
    if (state_->error)
      std::rethrow_exception(state_->error);
    device = state_->device;
  }
  // A bounded wait is a question about completion: answer it on the host.
  return !device || poll_device(*device, deadline);
}

at::Tensor Handle::result() const {
  wait();
  return state_->result;
}

std::vector<int64_t> Handle::received_splits() const {
  wait();
  return state_->splits;
}

namespace detail {

void DeviceWork::rethrow_if_failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_)
    std::rethrow_exception(error_);
}

bool DeviceWork::query() {
  rethrow_if_failed();
  if (!done_.query())
    return false;
  // Aborted work completes its event too: look again.
  rethrow_if_failed();
  return true;
}

c10::Stream DeviceWork::block_current() {
  rethrow_if_failed();
  const c10::Device device(done_.device_type(), done_.device_index());
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStream(device);
  done_.block(stream);
  return stream;
}

void DeviceWork::fail(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_)
    error_ = std::move(error);
}

bool DeviceWork::finished() {
  try {
    return done_.query();
  } catch (...) {
    // A device error (sticky, from any kernel): the work cannot be known
    // to have run. Waiters get the error.
    fail(std::current_exception());
    return true;
  }
}

void HandleState::finish(std::exception_ptr e) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex);
    error = std::move(e);
    done = true;
    callbacks.swap(on_done);
  }
  cv.notify_all();
  for (auto& fn : callbacks)
    fn();
}

void when_done(const Handle& handle, std::function<void()> fn) {
  const std::shared_ptr<HandleState>& state = handle.state();
  TORCH_CHECK(state != nullptr, "ronde: when_done() on an empty Handle");
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (!state->done) {
      state->on_done.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

CommWorker::CommWorker(Communicator& comm, bool blocking_wait)
    : comm_(comm), blocking_wait_(blocking_wait) {
  thread_ = std::thread([this] { loop(); });
}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable())
    thread_.join();
  // The queue is empty and every job finished: a helper still inside
  // help() only has yet to leave.
  std::unique_lock<std::mutex> lock(mutex_);
  helpers_left_.wait(lock, [&] { return helpers_ == 0; });
}

void CommWorker::help(HandleState& state) {
  CommWorker* w = nullptr;
  {
    // The job is not done, so its worker has not finished draining its
    // queue: it exists, and waits in its destructor for this helper.
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.done || state.worker == nullptr)
      return;
    w = state.worker;
    std::lock_guard<std::mutex> worker_lock(w->mutex_);
    ++w->helpers_;
  }
  w->run_queued_until(state);
  std::lock_guard<std::mutex> lock(w->mutex_);
  --w->helpers_;
  // Under the lock: the destructor cannot return before it is released.
  w->helpers_left_.notify_all();
}

void CommWorker::run_queued_until(const HandleState& target) {
  if (executing == this)
    return;           // a job of this worker waits: it holds busy_ itself
  bool ran = false;   // this thread ran a job, so kept the worker from it
  bool held = false;  // this thread holds busy_
  bool target_ran = false;
  for (;;) {
    Item item;
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (held) {
        busy_ = false;
        held = false;
      }
      if (!target_ran && !busy_ && !queue_.empty() &&
          queue_.front().state->worker != nullptr) {
        item = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        held = true;
      } else {
        // The worker thread, woken while this one ran a job, found busy_
        // and went back to sleep: what is left is its own again.
        wake = ran && (!queue_.empty() || stopping_);
      }
    }
    if (!held) {
      if (wake)
        cv_.notify_all();
      return;
    }
    execute(JobRef::of(item.job), *item.state, item.what);
    ran = true;
    target_ran = item.state.get() == &target;
  }
}

Handle CommWorker::submit_ref(
    JobRef job, bool run_inline, std::string what, bool helpable) {
  auto state = std::make_shared<HandleState>();
  state->blocking_wait = blocking_wait_;
  if (helpable)
    state->worker = this;
  if (executing == this) {
    run_nested(job, *state);
    return Handle(state);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "ronde: collective submitted during shutdown()");
    if (!run_inline || busy_ || !queue_.empty()) {
      queue_.push_back(Item{job.take(), state, std::move(what)});
      cv_.notify_one();
      return Handle(state);
    }
    busy_ = true;
  }
  execute(job, *state, what);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    wake = !queue_.empty() || stopping_;
  }
  // The idle worker needs waking only for what came meanwhile: a needless
  // wake-up costs a context switch per call, and on a host with as many
  // ranks as cores the woken thread preempts a rank in its collective.
  if (wake)
    cv_.notify_all();
  return Handle(state);
}

WorkProgress CommWorker::progress() const {
  std::lock_guard<std::mutex> lock(progress_mutex_);
  return progress_;
}

void CommWorker::run_nested(JobRef job, HandleState& state) {
  if (broken_) {
    state.finish(broken_);
    return;
  }
  run_job(job, state);
}

void CommWorker::run_job(JobRef job, HandleState& state) {
  std::exception_ptr error;
  const CommWorker* outer = executing;
  executing = this;
  try {
    job(comm_, state);
  } catch (const CommError& e) {
    // A job that failed because a collective it ran inside it did (a
    // hook's) passes that error on as it is.
    if (!broken_) {
      broken_ = std::make_exception_ptr(CommError(
          CommError::Kind::Broken,
          e.operation(),
          e.tensor(),
          e.rank(),
          e.suspect_ranks(),
          e.backend(),
          std::string("unusable after an earlier failure: ") + e.what()));
      failed_.store(true, std::memory_order_release);
    }
    error = std::current_exception();
  } catch (...) {
    // The caller's mistake (a mismatch, a bad argument): every rank saw the
    // same verdict, so the communicator stays usable.
    error = std::current_exception();
  }
  // Callbacks run by finish() queue what they submit, as from any thread.
  executing = outer;
  state.finish(error);
}

void CommWorker::execute(
    JobRef job, HandleState& state, const std::string& what) {
  if (broken_) {
    state.finish(broken_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(progress_mutex_);
    progress_.started += 1;
    progress_.running = true;
    progress_.what = what;
    progress_.since = std::chrono::steady_clock::now();
  }
  struct Done {
    CommWorker* w;
    ~Done() {
      std::lock_guard<std::mutex> lock(w->progress_mutex_);
      w->progress_.running = false;
    }
  } done{this};
  run_job(job, state);
}

void CommWorker::loop() {
  detail::timeline_thread_name("communication");
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] {
        return (stopping_ && !busy_) || (!queue_.empty() && !busy_);
      });
      if (queue_.empty())
        return;  // stopping and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    execute(JobRef::of(item.job), *item.state, item.what);
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;  // only this thread waits on cv_: nobody to wake
  }
}

}  // namespace detail
}  // namespace ronde
