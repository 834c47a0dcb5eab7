// The communication worker: collectives run one at a time, in the order they
// were submitted, so every rank executes the same sequence: on its own
// thread, or inline on the caller's thread for a blocking call that finds
// nothing queued. Callers get a Handle to wait on. See docs/thread_model.md.
#pragma once

#include "runtime/stall_inspector.h"

#include <ronde/collectives.h>

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace ronde::detail {

class Communicator;
class CommWorker;
class DeviceWork;

struct HandleState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;            // guarded by mutex
  std::exception_ptr error;     // guarded by mutex; set before done
  at::Tensor result;            // written by the worker before done
  std::vector<int64_t> splits;  // alltoall's received splits, likewise
  // Device work the job enqueued and may not have finished when `done` is
  // set (written before done); null for work that finished on the host.
  std::shared_ptr<DeviceWork> device;
  // RONDE_BLOCKING_WAIT: wait() on device work blocks the host until the
  // device finished it. Set at submit.
  bool blocking_wait = false;
  // The worker that queued the job when a waiting thread may run it (a
  // collective's job, not a task), set at submit; only read while `done`
  // is false, when the worker cannot be gone (CommWorker::help()).
  CommWorker* worker = nullptr;
  // What when_done() attached and finish() has not run yet; guarded by
  // mutex.
  std::vector<std::function<void()>> on_done;

  // Sets done and wakes the waiters, then runs the attached callbacks.
  void finish(std::exception_ptr e);
};

// Runs `fn` once the collective of `handle` finished, successfully or not:
// at once on this thread when it already has, else on the thread that
// finishes it (the set's worker, or the caller of an inline job), right
// after its waiters were woken. `fn` must not wait on a collective of the
// same set (the worker would wait on itself), and must not throw. Handles of
// device work are done once queued: this is for host work.
void when_done(const Handle& handle, std::function<void()> fn);

class CommWorker {
 public:
  // `blocking_wait`: see HandleState.
  CommWorker(Communicator& comm, bool blocking_wait);
  // Runs what is queued, then stops the thread.
  ~CommWorker();

  // A job throws ronde::CommError for a peer or network failure (which
  // breaks the communicator for good) and c10::Error for a caller's mistake.
  using Job = std::function<void(Communicator&, HandleState&)>;

  // A job by reference, for the length of a submit() call: run there, it
  // costs no Job (an allocation and a copy of its captures); queued, it is
  // moved into one.
  class JobRef {
   public:
    template <typename F>
    static JobRef of(F& f) {
      JobRef r;
      r.obj_ = &f;
      r.run_ = [](void* o, Communicator& c, HandleState& s) {
        (*static_cast<F*>(o))(c, s);
      };
      r.take_ = [](void* o) { return Job(std::move(*static_cast<F*>(o))); };
      return r;
    }
    void operator()(Communicator& c, HandleState& s) const {
      run_(obj_, c, s);
    }
    // The job itself, moved out of the referent.
    Job take() const {
      return take_(obj_);
    }

   private:
    JobRef() = default;
    void* obj_ = nullptr;
    void (*run_)(void*, Communicator&, HandleState&) = nullptr;
    Job (*take_)(void*) = nullptr;
  };
  // Queues the job. With run_inline, a job submitted while nothing is queued
  // or running runs on the caller's thread instead: a blocking collective
  // then costs no thread hand-off (two wake-ups, which dominate small
  // messages), and the order of execution is still the order of submission.
  // A job submitted by a job of this worker, on its thread (a
  // communication hook's collectives), runs at once, inside it.
  // `what` describes the job for the stall inspector ("allreduce 'x'").
  // `helpable`: a thread waiting on it may run it (help()); false for a
  // task whose code is not ronde's (a communication hook's), which runs
  // on this worker's thread (or inline) only.
  template <typename F>
  Handle submit(
      F&& job,
      bool run_inline = false,
      std::string what = "",
      bool helpable = true) {
    static_assert(!std::is_lvalue_reference_v<F>, "submit() takes the job");
    return submit_ref(JobRef::of(job), run_inline, std::move(what), helpable);
  }

  // What the worker has done, for the stall inspector.
  WorkProgress progress() const;

  // Whether a peer failure broke the communicator (every later collective
  // fails at once); readable from any thread.
  bool failed() const {
    return failed_.load(std::memory_order_acquire);
  }

  // Called by a thread about to wait on `state`: while its job is queued
  // and nothing runs, this thread runs the queued jobs, in order, up to and
  // including that one, instead of waiting for the worker thread to wake
  // (two wake-ups, which cost a small collective more than its work).
  // Returns at once when the job is done or running, or another thread
  // runs one, or a job that is not helpable comes first; the caller then
  // waits as before.
  static void help(HandleState& state);

 private:
  void loop();
  Handle submit_ref(
      JobRef job, bool run_inline, std::string what, bool helpable);
  void execute(JobRef job, HandleState& state, const std::string& what);
  void run_nested(JobRef job, HandleState& state);
  // Runs the job and finishes its state, with this worker marked as the
  // thread's; a peer failure breaks the worker.
  void run_job(JobRef job, HandleState& state);
  // help()'s part: runs queued jobs while no one else does, until the one
  // of `target` ran.
  void run_queued_until(const HandleState& target);

  Communicator& comm_;  // owned by the World, outlives the worker
  const bool blocking_wait_;
  std::mutex mutex_;
  std::condition_variable cv_;
  // Guarded by mutex_:
  struct Item {
    Job job;
    std::shared_ptr<HandleState> state;
    std::string what;
  };
  std::deque<Item> queue_;
  bool stopping_ = false;
  // A job is executing (on the worker or inline on a caller): at most one
  // at a time, so the communicator needs no lock of its own.
  bool busy_ = false;
  // Threads inside help(), guarded by mutex_: the destructor waits on
  // helpers_left_ for them to leave.
  int helpers_ = 0;
  std::condition_variable helpers_left_;
  // Touched only by whoever holds busy_: after a peer failure every later
  // collective fails at once with the first error.
  std::exception_ptr broken_;
  std::atomic<bool> failed_{false};  // broken_ is set
  mutable std::mutex progress_mutex_;
  WorkProgress progress_;  // guarded by progress_mutex_
  std::thread thread_;
};

}  // namespace ronde::detail
