// Elastic training: the job goes on when ranks die, without restarting the
// survivors and without losing a sample. The training state is committed
// in memory every few steps; a failure inside ronde::elastic::run() makes
// the survivors form a new world, take rank 0's last commit, and carry on.
#pragma once

#include <ronde/checkpoint.h>
#include <ronde/runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ronde {

class DistributedOptimizer;

namespace elastic {

// Typical use (run under ronderun --min-np N, whose store outlives every
// rank):
//   ronde::elastic::State state;
//   state.add("model", *model).add("optimizer", opt).add("schedule", sched)
//       .add("sampler", sampler).add("epoch", epoch).add("step", step);
//   ronde::elastic::run(state, [&] {
//     for (; epoch < epochs; ++epoch, sampler.set_epoch(epoch)) {
//       while (auto batch = sampler.next(per_rank_batch)) {
//         ...; opt.step(); sched.step();
//         if (++step % 10 == 0) state.commit();
//       }
//     }
//   });
//
// Ranks lost are left behind; ranks started later (ronderun
// --restart-failed, --host-discovery-script) join at a commit and take the
// state from rank 0. What depends on the world follows it: a
// DistributedOptimizer's LR factor (lr_scaling) is recomputed for the new size,
// a WarmupScheduler keeps its step and rescales its peak, and a
// DistributedSampler splits what is left of the epoch over the new ranks, so
// every sample is used once. Added process sets do not survive a change of
// world: make them again in an on_reset() callback. Random number generators
// are not part of a commit. What commit() throws when processes wait to join
// (Horovod's name): run() admits them and goes on with the bigger world from
// this commit.
class HostsUpdatedInterrupt : public std::runtime_error {
 public:
  HostsUpdatedInterrupt()
      : std::runtime_error("ronde: processes wait to join the job") {}
};

class State {
 public:
  State();

  // What is committed and restored, as Checkpointer::add().
  State& add(const std::string& name, torch::nn::Module& module);
  State& add(const std::string& name, DistributedOptimizer& optimizer);
  State& add(const std::string& name, torch::optim::Optimizer& optimizer);
  State& add(const std::string& name, WarmupScheduler& scheduler);
  State& add(const std::string& name, GradScaler& scaler);
  State& add(const std::string& name, DistributedSampler& sampler);
  State& add(const std::string& name, int64_t& counter);
  State& add(
      const std::string& name,
      std::function<void(torch::serialize::OutputArchive&)> save,
      std::function<void(torch::serialize::InputArchive&)> load);
  // Runs after each change of world, once the state is rank 0's commit
  // (Horovod's reset callbacks).
  State& on_reset(std::function<void()> callback);

  // Keeps a copy of everything added, in this rank's memory (no disk), then
  // asks whether processes wait to join (check_host_updates(): one small
  // collective) and throws HostsUpdatedInterrupt when they do.
  void commit();
  // Loads this rank's last commit back.
  void restore();
  // Makes rank 0's last commit every rank's (a collective), and loads it.
  void sync();

  int64_t commits() const {
    return commits_;
  }
  // Bytes of tensor data in the last commit.
  size_t committed_bytes() const;
  // Changes of world survived so far.
  int64_t resets() const {
    return resets_;
  }

 private:
  friend void run(State& state, const std::function<void()>& train);
  // After a change of world: the world-dependent pieces adapt, rank 0's
  // commit is loaded, the callbacks run.
  void reset();
  // commit() without asking about joiners.
  void save();

  // The entries as an archive would hold them, their tensors copied.
  struct Commit;

  Checkpointer entries_;
  std::shared_ptr<Commit> commit_;
  int64_t commits_ = 0;
  int64_t resets_ = 0;
  std::vector<DistributedOptimizer*> optimizers_;
  std::vector<DistributedSampler*> samplers_;
  std::vector<std::function<void()>> callbacks_;
};

// Runs `train` on the state: first every rank takes rank 0's state (sync)
// and commits it; then `train` runs until it returns. When a ronde::CommError
// comes out of it (a rank died: any collective, step() included), the
// survivors form a new world, the state becomes rank 0's last commit, and
// `train` is called again; when a commit finds processes waiting to join,
// they are admitted and take the state the same way. A process started to
// join (elastic::joining()) first waits for its admission, and returns at
// once when the training ended first. Returns when `train` returns; throws
// the CommError (kind Rendezvous) when the job cannot go on: fewer ranks
// left than RONDE_ELASTIC_MIN_NP within the timeout, or the store gone.
void run(State& state, const std::function<void()>& train);

}  // namespace elastic
}  // namespace ronde
