// DistributedOptimizerOptions: how the gradient engine buckets, reduces,
// compresses and tunes, shared by DistributedOptimizer (optimizer.h) and
// GradientReducer (gradient_reducer.h), which both include it.
#pragma once

#include <ronde/collectives.h>
#include <ronde/comm_hook.h>
#include <ronde/process_set.h>
#include <ronde/schedule.h>

#include <torch/arg.h>

#include <cstdint>
#include <functional>

namespace ronde {

// The default bucket size, from benchmarks/fusion_bench on 2 CPU ranks (see
// benchmarks/README.md for the measurement).
constexpr double kDefaultFusionThresholdMb = 25;

// What travels on the wire: buckets of float32/float64 gradients can be cast
// to 16 bits for the all-reduce and back after it, halving the bytes at the
// cost of rounding (about 3 decimal digits for FP16, 2 for BF16).
enum class Compression { None, FP16, BF16 };

struct DistributedOptimizerOptions {
  // Bucket size in MiB: gradients are packed into buckets of about this size
  // and each bucket is all-reduced in one call. 0: RONDE_FUSION_THRESHOLD
  // (bytes, as Horovod's HOROVOD_FUSION_THRESHOLD), else the default chosen
  // from benchmarks/fusion_bench (see kDefaultFusionThresholdMb).
  TORCH_ARG(double, fusion_threshold_mb) = 0;
  // The first bucket is smaller so that communication starts early in
  // backward. 1 MiB, as c10d's Reducer.
  TORCH_ARG(double, first_bucket_mb) = 1;
  // Backward passes accumulated locally before one all-reduce; step() must
  // be called after exactly this many.
  TORCH_ARG(int64_t, backward_passes_per_step) = 1;
  // With backward_passes_per_step > 1: divide the accumulated gradient by
  // that count too, so a step sees the mean over every micro-batch of every
  // rank (what one process would compute on the global batch).
  TORCH_ARG(bool, average_aggregated_gradients) = true;
  // Average (the mean gradient, the default) or Sum over ranks.
  TORCH_ARG(ReduceOp, op) = ReduceOp::Average;
  // Divide by this before the all-reduce and multiply after it, to keep
  // low-precision sums in range. 1: no effect.
  TORCH_ARG(double, gradient_predivide_factor) = 1.0;
  // Make each parameter's .grad a view into its bucket, so packing costs no
  // copy. Off: gradients are copied into and out of the buckets.
  TORCH_ARG(bool, gradient_as_bucket_view) = true;
  // Multiply every param group's LR at construction by the number of
  // replicas x backward_passes_per_step (Linear) or its square root (Sqrt).
  // The base LR is remembered: wrapping the same optimizer again, or
  // loading state through this object, never compounds the scaling.
  TORCH_ARG(LrScaling, lr_scaling) = LrScaling::None;
  // Shorthand for comm_hook(fp16_compress_hook()) or bf16's; sharded, the
  // reduce-scatter and all-gather travel so.
  TORCH_ARG(Compression, compression) = Compression::None;
  // What each bucket's reduction is (ronde/comm_hook.h): null, the
  // all-reduce (or compression's hook). One hook serves one optimizer at a
  // time; sharded optimizers take the default only.
  TORCH_ARG(std::shared_ptr<CommHook>, comm_hook) = nullptr;
  // Rebuild the buckets once, at the end of the first step, in the order
  // the gradients became ready during it (rank 0's order, on every rank),
  // as c10d's Reducer does after its first iteration: the first bucket then
  // holds the first gradients backward produces, whatever order the model
  // registered its parameters in.
  TORCH_ARG(bool, rebuild_buckets) = true;
  // Tune fusion_threshold_mb and first_bucket_mb on the running job: from
  // the second step, trials of autotune_warmup_steps unmeasured and
  // autotune_steps_per_trial measured steps each try bucket sizes on a log2
  // scale, then first-bucket sizes, then the best of those against the
  // starting sizes in alternating trials (at most 16 trials; the starting
  // sizes stay unless the best was faster beyond noise); rank 0 scores
  // each by its median step time and every rank switches to rank 0's
  // choice at the same step. One log line gives the choice and its
  // figures; bucket_sizing() reads it and checkpoints keep it.
  // RONDE_AUTOTUNE=1|0, when set, overrides this.
  TORCH_ARG(bool, autotune) = false;
  TORCH_ARG(int64_t, autotune_warmup_steps) = 1;
  TORCH_ARG(int64_t, autotune_steps_per_trial) = 5;
  // The clock autotune times steps with, in seconds; null: a steady clock.
  // For tests, which inject one.
  TORCH_ARG(std::function<double()>, autotune_clock) = nullptr;
  // The ranks that train this model together: gradients are averaged over
  // this set (its size also sets the LR scaling). Default: the whole job.
  // Two sets can train two models at once; a rank outside the set cannot
  // construct the optimizer for it.
  TORCH_ARG(ProcessSet, process_set) = ProcessSet();
  // While ranks are in ronde::join() (uneven inputs), an average divides
  // the gradient sum by the ranks that contributed (the default: the step
  // equals one process over the samples actually seen, each rank's batch
  // weighing alike), or with this option by the set's size, as DDP's
  // divide_by_initial_world_size: g = (1/N) * sum over active ranks of g_r.
  // Without joined ranks both are the mean over the set.
  TORCH_ARG(bool, divide_by_set_size) = false;
  // ZeRO stage 1: each rank of the set keeps the optimizer state of its own
  // contiguous range of every bucket only (1/N of it). Backward
  // reduce-scatters each bucket, the wrapped optimizer steps on flat views
  // of the owned ranges of the parameters, and an all-gather per bucket
  // brings every rank's updated range back. Needs an element-wise
  // optimizer (SGD, Adam, AdamW, RMSprop, Adagrad, or one deriving from
  // ronde::ElementwiseOptimizer); docs/sharding.md says what else changes.
  TORCH_ARG(bool, shard_optimizer_state) = false;
  // ZeRO stage 2 (implies stage 1): a bucket's full-size gradient lives
  // only until its reduce-scatter; each parameter's .grad is released when
  // its bucket is sent, and only the owned range is kept.
  TORCH_ARG(bool, shard_gradients) = false;
};

}  // namespace ronde
