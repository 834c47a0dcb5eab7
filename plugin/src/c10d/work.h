// What a ronde c10d operation returns: a c10d::Work completed when the
// ronde collectives behind it finished and their outputs were copied to
// where torch wants them, with a future that DDP's reducer and comm hooks
// chain on. docs/c10d_backend.md says which thread completes what.
#pragma once

#include <ronde/collectives.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace ronde::detail {

class C10dWork : public ::c10d::Work {
 public:
  // `what` names the operation in errors ("allreduce on rank 1");
  // `outputs` are the future's value.
  C10dWork(
      int rank,
      ::c10d::OpType type,
      std::string what,
      std::vector<at::Tensor> outputs);

  // Ends the work, with `error` or successfully: completes the future,
  // whose callbacks run here, then wakes wait() (torch's gloo keeps this
  // order too: wait() returns once the callbacks ran). Called once.
  void complete(std::exception_ptr error);

  // With a timeout: a clear error when it passes first (the collective
  // goes on). Without one: this thread runs the work's collectives when
  // they are queued and nothing runs (Handle::wait()), then waits until
  // done, which ronde's own timeout bounds.
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  // Made on first use: a work nobody asked the future of has no callback,
  // so any thread may complete it (claim_completion()).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // The collectives behind the work, for wait() to run; set once, before
  // the work is returned.
  void set_handles(std::vector<Handle> handles);

  // Called on the thread that finished the work's last collective, which
  // holds the worker: whether it may complete the work itself, because
  // nobody has the future yet (a getFuture() meanwhile waits for the
  // completion and makes the future completed). Else future callbacks,
  // which may submit and wait on a collective, would run on it.
  bool claim_completion();

 private:
  void settle_future(const c10::intrusive_ptr<c10::ivalue::Future>& f);

  const std::string what_;
  std::vector<at::Tensor> outputs_;
  std::mutex state_mutex_;  // guards the members below
  std::condition_variable settled_cv_;
  std::vector<Handle> handles_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // null until asked for
  bool claimed_ =
      false;  // a thread without a claim to run callbacks completes it
  bool settled_ = false;      // complete() ran
  std::exception_ptr error_;  // complete()'s error
};

// A work that has already failed with `error`, for a bad call found before
// anything was submitted (every rank of the group finds it alike, or the
// collective that follows fails on every rank).
c10::intrusive_ptr<C10dWork> failed_work(
    int rank,
    ::c10d::OpType type,
    const std::string& what,
    std::exception_ptr error);

// Completes `work` once every one of `handles` finished: with the first
// error, else once `finish` (the copies of the results into torch's
// outputs; may be empty) ran, an exception there being the work's error.
// Runs on the thread that finishes the last handle when that thread may
// run the future's callbacks (C10dWork::claim_completion(), or the caller
// before this returns), after its job on a thread waiting on the work, else
// on a completion thread.
void complete_when_done(
    const c10::intrusive_ptr<C10dWork>& work,
    std::vector<Handle> handles,
    std::function<void()> finish);

}  // namespace ronde::detail
