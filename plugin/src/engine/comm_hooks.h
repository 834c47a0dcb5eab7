// What the gradient engine needs of the communication hooks
// (ronde/comm_hook.h): the hook its options ask for, the claim that keeps
// one hook to one engine, and the launch of a bucket through it.
#pragma once

#include <ronde/collectives.h>
#include <ronde/comm_hook.h>
#include <ronde/optimizer_options.h>

#include <memory>

namespace ronde::detail {

// options.comm_hook(), else compression's hook, else the all-reduce.
std::shared_ptr<CommHook> choose_hook(
    const DistributedOptimizerOptions& options);

// Holds a hook for one engine: a second claim of the same hook while the
// first lives fails (its state would mix two models).
class HookClaim {
 public:
  explicit HookClaim(std::shared_ptr<CommHook> hook);
  ~HookClaim();
  HookClaim(const HookClaim&) = delete;
  HookClaim& operator=(const HookClaim&) = delete;
  const std::shared_ptr<CommHook>& hook() const {
    return hook_;
  }

 private:
  std::shared_ptr<CommHook> hook_;
};

// Runs the hook on the bucket: a job on the process set's communication
// thread for host memory, or here for a device's (then done at once).
Handle launch_comm_hook(std::shared_ptr<CommHook> hook, CommBucket bucket);

}  // namespace ronde::detail
