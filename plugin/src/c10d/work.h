// What a ronde c10d operation returns: a c10d::Work completed when the
// ronde collectives behind it finished and their outputs were copied to
// where torch wants them, with a future that DDP's reducer and comm hooks
// chain on. docs/c10d_backend.md says which thread completes what.
#pragma once

#include <ronde/collectives.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <functional>
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

  // Ends the work, with `error` or successfully: wakes wait() and completes
  // the future, whose callbacks run here. Called once.
  void complete(std::exception_ptr error);

  // With a timeout: a clear error when it passes first (the collective
  // goes on). Without one: until done, which ronde's own timeout bounds.
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  const std::string what_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
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
// Runs on the thread that finishes the last handle.
void complete_when_done(
    const c10::intrusive_ptr<C10dWork>& work,
    std::vector<Handle> handles,
    std::function<void()> finish);

}  // namespace ronde::detail
