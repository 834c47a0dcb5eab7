// The C10dWork of ronde's c10d backend (c10d/work.h).
#include "c10d/work.h"

#include "comm/comm_worker.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

namespace ronde::detail {

namespace {

// A thread inside C10dWork::wait() without a timeout: the work, and how
// to complete it when this thread finished its last collective.
struct Waiting {
  const C10dWork* work;
  std::function<void()> settle;
};
thread_local Waiting* waiting = nullptr;

// Called where a collective of `work` finished, holding the worker: on a
// thread waiting on that work, keeps `settle` for wait() to run once the
// worker is free (callbacks may submit and wait on a collective), and says
// so.
bool defer_to_waiter(const C10dWork* work, std::function<void()> settle) {
  if (waiting == nullptr || waiting->work != work)
    return false;
  waiting->settle = std::move(settle);
  return true;
}

}  // namespace

C10dWork::C10dWork(
    int rank,
    ::c10d::OpType type,
    std::string what,
    std::vector<at::Tensor> outputs)
    : ::c10d::Work(rank, type),
      what_(std::move(what)),
      outputs_(std::move(outputs)) {}

void C10dWork::settle_future(const c10::intrusive_ptr<c10::ivalue::Future>& f) {
  if (error_)
    f->setError(error_);
  else
    f->markCompleted(c10::IValue(outputs_));
}

void C10dWork::complete(std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    settled_ = true;
    error_ = error;
    future = future_;  // when null, getFuture() completes the one it makes
    handles_.clear();  // done: what they hold is not needed any more
  }
  settled_cv_.notify_all();
  try {
    if (future)
      settle_future(future);
  } catch (...) {
    finish(error);  // a callback threw: the work itself still ended
    throw;
  }
  finish(error);
}

void C10dWork::set_handles(std::vector<Handle> handles) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  handles_ = std::move(handles);
}

bool C10dWork::claim_completion() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (future_)
    return false;
  claimed_ = true;
  return true;
}

bool C10dWork::wait(std::chrono::milliseconds timeout) {
  if (timeout != ::kNoTimeout && timeout.count() > 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool done =
        cv_.wait_for(lock, timeout, [this] { return completed_; });
    TORCH_CHECK(
        done,
        "ronde: ",
        what_,
        " did not finish within the ",
        timeout.count(),
        " ms given to wait(); it is still running (a peer may be slow or "
        "stuck in another call: ronde's own timeout ends it)");
  } else {
    std::vector<Handle> handles;
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      handles = handles_;
    }
    // Run them here if they are still queued: no wake-up of the worker,
    // and none of a completion thread when this thread finishes the last.
    Waiting frame{this, {}};
    Waiting* outer = waiting;
    waiting = &frame;
    for (const Handle& h : handles) {
      try {
        h.wait();
      } catch (...) {
        break;  // the work carries the error: thrown below
      }
    }
    waiting = outer;
    // This thread finished the last of them: it completes the work, now
    // that it holds the worker no more.
    if (frame.settle)
      frame.settle();
  }
  return ::c10d::Work::wait(::kNoTimeout);
}

std::vector<at::Tensor> C10dWork::result() {
  return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> C10dWork::getFuture() {
  std::unique_lock<std::mutex> lock(state_mutex_);
  if (!future_) {
    // A thread that claimed the completion completes no future: wait until
    // it is done, then make this one completed.
    settled_cv_.wait(lock, [this] { return !claimed_ || settled_; });
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    if (settled_)
      settle_future(future_);  // no callback yet: nothing runs here
  }
  return future_;
}

c10::intrusive_ptr<C10dWork> failed_work(
    int rank,
    ::c10d::OpType type,
    const std::string& what,
    std::exception_ptr error) {
  auto work = c10::make_intrusive<C10dWork>(
      rank, type, what, std::vector<at::Tensor>{});
  work->complete(std::move(error));
  return work;
}

namespace {

// Where works that a ronde worker finished are completed: their futures'
// callbacks (DDP's, a comm hook's) may submit a collective and wait on its
// future (PowerSGD does), which the worker would then never finish if it
// ran them itself. A thread is added whenever every thread is busy, so a
// callback blocked on a later work never holds that work back. One pool
// per process, deliberately never destroyed (its threads may still be
// waiting when the process exits).
class Completer {
 public:
  static Completer& get() {
    static Completer* completer = new Completer();
    return *completer;
  }

  void post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(fn));
    if (queue_.size() > idle_)
      std::thread([this] { loop(); }).detach();
    else
      cv_.notify_one();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return !queue_.empty(); });
      --idle_;
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded
  size_t idle_ = 0;                          // guarded: threads waiting
};

// What the handles of one work share until the last is done.
struct Pending {
  c10::intrusive_ptr<C10dWork> work;
  std::vector<Handle> handles;
  std::function<void()> finish;
  std::atomic<size_t> left{0};
  std::atomic<bool> returned{false};  // complete_when_done() has returned
};

void settle(const std::shared_ptr<Pending>& pending, bool here) {
  if (!here) {
    Completer::get().post([pending] { settle(pending, true); });
    return;
  }
  Pending& p = *pending;
  std::exception_ptr error;
  for (const Handle& h : p.handles) {
    try {
      h.wait();  // done: rethrows its error, if any
    } catch (...) {
      error = std::current_exception();
      break;
    }
  }
  if (!error && p.finish) {
    try {
      p.finish();
    } catch (...) {
      error = std::current_exception();
    }
  }
  try {
    p.work->complete(error);
  } catch (const std::exception& e) {
    // A future's callback that threw: c10 reports it through the future's
    // dependents; nothing more to do on the worker.
    std::cerr << "ronde: warning: a callback of a c10d work failed: "
              << e.what() << std::endl;
  }
}

}  // namespace

void complete_when_done(
    const c10::intrusive_ptr<C10dWork>& work,
    std::vector<Handle> handles,
    std::function<void()> finish) {
  auto p = std::make_shared<Pending>();
  p->work = work;
  p->handles = std::move(handles);
  p->finish = std::move(finish);
  p->left = p->handles.size();
  work->set_handles(p->handles);
  if (p->handles.empty()) {
    settle(p, true);
    return;
  }
  // Done before this returns (an inline call: nobody has the future yet),
  // or on a thread that may complete the work: completed here; else on
  // the Completer.
  const std::thread::id caller = std::this_thread::get_id();
  for (const Handle& h : std::vector<Handle>(p->handles)) {
    when_done(h, [p, caller] {
      if (p->left.fetch_sub(1) != 1)
        return;
      if (defer_to_waiter(p->work.get(), [p] { settle(p, true); }))
        return;
      settle(
          p,
          (std::this_thread::get_id() == caller && !p->returned) ||
              p->work->claim_completion());
    });
  }
  p->returned = true;
}

}  // namespace ronde::detail
