// The gradient engine: a post-hook on each parameter's gradient accumulator
// marks the parameter ready during backward; a bucket whose parameters are
// all ready is packed and all-reduced at once, asynchronously, provided
// every earlier bucket has been launched (so every rank launches the same
// buckets in the same order whatever order the hooks fire in).
// synchronize() launches what is left, waits, and writes the averaged
// gradients back. DistributedOptimizer and GradientReducer are its users;
// see docs/architecture.md for the path of one gradient through it.
#pragma once

#include "engine/autotune.h"
#include "engine/bucket_layout.h"
#include "engine/comm_hooks.h"
#include "engine/sharding.h"
#include "runtime/settings.h"

#include <ronde/gradient_reducer.h>

#include <torch/csrc/autograd/function.h>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {

// The 16-bit type a compressed bucket travels as.
inline at::ScalarType wire_dtype(Compression c) {
  return c == Compression::FP16 ? at::kHalf : at::kBFloat16;
}

// Whether a bucket of `t`'s type travels compressed: floating buckets of
// 32 or 64 bits, when compression is on.
inline bool compressible(const at::Tensor& t, Compression c) {
  return c != Compression::None &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

class GradientEngine : public std::enable_shared_from_this<GradientEngine> {
 public:
  // How the autograd graph holds a node: std::shared_ptr up to LibTorch
  // 2.12, c10::intrusive_ptr from 2.13. Taken from the API, so both build.
  using NodePtr = decltype(torch::autograd::impl::grad_accumulator(
      std::declval<const at::Tensor&>()));

  // Checks the options and, across ranks, that every rank has the same
  // parameters; then lays out the buckets and hooks every parameter (the
  // hooks go when the engine does). `params` all require grad.
  static std::shared_ptr<GradientEngine> create(
      std::vector<std::string> names,
      std::vector<at::Tensor> params,
      const DistributedOptimizerOptions& options);
  ~GradientEngine();
  GradientEngine(const GradientEngine&) = delete;
  GradientEngine& operator=(const GradientEngine&) = delete;

  // The autograd hook of parameter `param` (its index in names()).
  void on_ready(size_t param);

  // Launches the buckets not yet launched, waits for every all-reduce and
  // writes the averaged gradients into .grad. Nothing if already done.
  void synchronize();
  bool synchronized() const;
  // Ends the step: the next backward pass starts a new one.
  void finish_step();
  // synchronize() then finish_step().
  void skip_step();
  // After a change of world (a collective of the new world): forgets the
  // step in flight without waiting for its all-reduces (they failed with
  // the old world), then takes rank 0's bucket order, sizes and step count,
  // so that a rank that joined lays its buckets out as the others do and
  // rebuilds nothing on its own; checked across ranks at the next step.
  void adapt_to_world();
  // See GradientReducer::step().
  at::Tensor step(
      const std::function<at::Tensor(GradientReducer::Closure)>& update,
      GradientReducer::Closure closure,
      bool synchronize);

  std::vector<at::Tensor> gradient_buffers() const;
  const std::shared_ptr<CommHook>& comm_hook() const {
    return hook_.hook();
  }
  // The hook's state (comm_hooks.cpp). consolidate_hook_state() gathers
  // every rank's to set rank `to` (a collective of the set), where
  // save_hook_state() then writes them all until the next step; else it
  // writes this rank's. load_hook_state() takes this rank's, or resets the
  // hook when the archive holds none for it (another world size).
  void consolidate_hook_state(int to);
  void save_hook_state(torch::serialize::OutputArchive& archive) const;
  void load_hook_state(torch::serialize::InputArchive& archive);

  // ZeRO (shard_optimizer_state / shard_gradients; engine/sharding.h).
  bool sharded() const {
    return sharded_;
  }
  // This rank's pieces, and for each the tensor the optimizer steps: a flat
  // view of that piece of its parameter, whose .grad synchronize() points
  // at the averaged range. Both change when the buckets are laid out again
  // (take_shards_changed() then says so, once).
  std::vector<ShardPiece> shard_pieces() const;
  std::vector<at::Tensor> shard_tensors() const;
  bool take_shards_changed();
  // The parameters by index (those the engine averages).
  std::vector<at::Tensor> parameters() const;
  // The global norm of the averaged gradients (norm_type 2, inf or any p),
  // computed piece by piece in the order of an aligned layout and summed
  // over the set, so that it comes out alike, bit for bit, sharded or not.
  double gradient_norm(double norm_type);

  std::vector<std::vector<std::string>> bucket_names() const;
  StepProfile last_profile() const;
  BucketSizing bucket_sizing() const;
  void set_bucket_sizing(const BucketSizing& sizing);
  const DistributedOptimizerOptions& options() const {
    return options_;
  }
  const std::vector<std::string>& names() const {
    return names_;
  }

 private:
  GradientEngine(
      std::vector<std::string> names,
      std::vector<at::Tensor> params,
      const DistributedOptimizerOptions& options,
      std::shared_ptr<CommHook> hook,
      const Settings& settings);

  // A parameter's progress in this step, and its hook.
  struct SlotState {
    int64_t passes = 0;
    NodePtr accumulator;
    uintptr_t hook_key = 0;
  };
  // A bucket's progress in this step.
  struct BucketState {
    size_t pending = 0;  // parameters not yet ready
    bool launched = false;
    Handle handle;
    at::Tensor wire;   // sharded: the 16-bit copy sent when compressing
    at::Tensor owned;  // sharded: this rank's averaged range, once waited
    // Sharded, on the host: the reduce-scatter's output, kept between
    // steps (a fresh one of tens of MB is faulted in page by page), and
    // with a 16-bit wire the wire's output it is converted from.
    at::Tensor kept_owned;
    at::Tensor kept_wire_owned;
  };
  // Sharded, on the host: the buffers stage 2 packs its buckets into, and
  // the 16-bit wires of either stage, kept between steps; one is free
  // again once the reduce-scatter reading it is done (sharded_step.cpp).
  struct Staging {
    at::Tensor buffer;
    Handle reader;      // the collective reading it, if any
    bool held = false;  // being packed, before its collective starts
    bool used = false;  // taken in this step
  };

  void hook(size_t slot, NodePtr accumulator);
  // Whether this rank contributes the slot's gradient to its bucket: what
  // pack() copies and what the used flags say must agree.
  bool used_here(size_t slot) const;
  // The steps of launching a bucket, and of synchronize(), each under
  // mutex_.
  void pack(size_t bucket);
  void write_used_mask(size_t bucket);
  void launch_ready();
  void launch(size_t bucket);
  void check_passes() const;
  void adopt_replaced_parameters();
  void wait_all();
  void unpack();
  void reset_locked();
  // Every bucket waiting for all its gradients, none launched.
  void reset_buckets_locked();
  // Between steps (relayout.cpp): the first step's rebuild and autotune's
  // switches.
  void after_step_locked();
  // The observed ready order of the first step, rank 0's on every rank.
  std::vector<size_t> agreed_order_locked();
  // At a trial's end: rank 0's next sizes, adopted by every rank.
  void autotune_decide_locked();
  // Lays the buckets out again in `order` with sizes_, keeping every .grad
  // that is a bucket view a view (of the new bucket, same values) and every
  // hook; nothing if the layout would not change.
  void relayout_locked(const std::vector<size_t>& order);
  std::vector<size_t> current_order_locked() const;
  // Where bucket buffers come from: the set's bucket_zeros(), which puts
  // them where shared memory all-reduces them without a copy.
  BufferZeros buffer_zeros() const;

  // Builds the bucket's CommBucket and runs the hook on it (comm_hooks.cpp).
  Handle launch_hooked(size_t bucket, const AllreduceOptions& options);

  // The sharded path (sharded_step.cpp), each under mutex_.
  struct ReduceFactors {
    ReduceOp op;
    double pre, post;
  };
  ReduceFactors reduce_factors() const;
  void launch_sharded(size_t bucket);
  // A kept staging buffer of at least `numel` elements of `options`'
  // type that nothing reads (the smallest that fits), else a new one;
  // held until released. Its index.
  size_t take_staging_locked(int64_t numel, const at::TensorOptions& options);
  // The reduce-scatter's output for bucket `bi` on the host (kept_owned,
  // or kept_wire_owned for a 16-bit wire), or none (a new tensor) on a
  // device.
  at::Tensor owned_into_locked(size_t bi, const at::Tensor& target);
  void wait_all_sharded();
  void unpack_sharded();
  void make_shards_locked();
  // After the update: every rank's updated range back into the parameters.
  void gather_parameters();

  const DistributedOptimizerOptions options_;
  const std::vector<std::string> names_;
  // The bucket's reduction (unsharded; sharded engines keep the default).
  HookClaim hook_;
  // consolidate_hook_state()'s gather, on its rank, until the next step.
  std::vector<std::string> hook_states_;
  // RONDE_BUCKET_COPY, from the settings init() read.
  const std::optional<bool> bucket_copy_whole_;
  mutable std::mutex mutex_;  // guards everything below against the hooks
  BucketLayout layout_;
  std::vector<SlotState> slot_state_;      // by slot
  std::vector<BucketState> bucket_state_;  // by bucket
  size_t next_launch_ = 0;
  bool synchronized_ = false;
  bool verified_ = false;  // the layout passed the cross-rank check
  int64_t hooks_ = 0;
  StepProfile profile_;
  StepProfile last_profile_;
  // The bucket sizes of the current layout, in MiB.
  BucketSizes sizes_;
  bool autotuned_ = false;
  // Steps finished (synchronized, then finish_step()).
  int64_t steps_ = 0;
  // Parameter indices in the order they became ready in the first step,
  // while rebuild_buckets waits for it.
  std::vector<size_t> ready_order_;
  std::unique_ptr<Autotuner> tuner_;  // while autotune searches
  const bool sharded_;
  const bool shard_gradients_;
  std::vector<ShardPiece> pieces_;
  std::vector<at::Tensor> shards_;  // by piece
  bool shards_changed_ = false;
  // Sharded, by slot, recorded at launch: whether this rank contributed
  // the gradient, and whether .grad was defined then (stage 2 releases it).
  std::vector<float> launched_used_;
  std::vector<char> had_grad_;
  Handle used_handle_;
  at::Tensor used_;  // the flags summed over ranks
  bool gather_verified_ = false;
  at::Tensor gather_pool_[2];     // the all-gathers' outputs, reused
  std::vector<Staging> staging_;  // stage 2, on the host
  double last_step_end_ = 0;      // on the autotune clock
};

// The engine over those of `parameters` that require grad (names and
// parameters paired by position; checked across ranks).
std::shared_ptr<GradientEngine> make_engine(
    const std::vector<std::string>& names,
    const std::vector<at::Tensor>& parameters,
    const DistributedOptimizerOptions& options);

}  // namespace ronde::detail
