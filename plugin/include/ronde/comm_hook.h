// Communication hooks: what the gradient engine does with a bucket once all
// its gradients are ready. The default all-reduces it; the 16-bit hooks cast
// it for the wire; PowerSGD sends a low-rank approximation of each matrix
// with error feedback; a user's own hook derives from CommHook. See
// docs/comm_hooks.md.
#pragma once

#include <ronde/collectives.h>
#include <ronde/process_set.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace ronde {

// One bucket, as a hook sees it.
struct CommBucket {
  // The bucket's flat tensor: every gradient's segment, in bucket order,
  // then one used flag per gradient (nonzero where the rank produced it).
  // The hook leaves in it the reduction over the process set that an
  // all-reduce with `options` would leave, or an approximation of it for
  // the gradients; the flags need only stay nonzero where any rank's was.
  at::Tensor buffer;
  // The gradients: views into `buffer`, shaped like their parameters.
  std::vector<at::Tensor> gradients;
  // Each gradient's parameter: its name, and its index in the optimizer's
  // list of parameters (stable when buckets are laid out again, so that
  // per-parameter state keys on it).
  std::vector<std::string> names;
  std::vector<size_t> parameters;
  size_t index = 0;   // the bucket's place in the launch order
  bool last = false;  // the step's last bucket
  int64_t step = 0;   // steps finished before this one (0: the first)
  ProcessSet process_set;
  // The all-reduce the engine would make: op, pre- and postscale factors,
  // the bucket's name, the process set, and whether to check the call.
  // A hook's own collectives take these (with a name of their own).
  AllreduceOptions options;
};

// A hook runs once per bucket and step, on the process set's communication
// thread for host tensors (its collectives run there at once, in order, so
// it is written as straight-line code: each async call is done when it
// returns), and on the launching thread for device tensors (collectives are
// queued and wait() orders the streams). The engine waits on the hook's
// job, so backward goes on meanwhile. Every rank runs the same hooks with
// the same buckets in the same order; collectives must follow suit.
class CommHook {
 public:
  virtual ~CommHook() = default;
  // "allreduce", "fp16", "bf16", "powersgd", or the user's.
  virtual std::string name() const = 0;
  // The name with every option that must agree across ranks: the engine
  // checks it at construction.
  virtual std::string describe() const {
    return name();
  }
  // Reduces `bucket.buffer` in place (see CommBucket::buffer).
  virtual void reduce(CommBucket& bucket) = 0;
  // State kept across steps (PowerSGD's matrices and error buffers), this
  // rank's own: DistributedOptimizer::save() and load() carry it, the
  // Checkpointer for every rank. reset() forgets it (a change of world,
  // or a checkpoint of another world size).
  virtual void save(torch::serialize::OutputArchive& archive) const;
  virtual void load(torch::serialize::InputArchive& archive);
  virtual void reset() {}
  // Whether save() writes anything (the Checkpointer then gathers every
  // rank's state to rank 0).
  virtual bool stateful() const {
    return false;
  }

  // The bytes this rank handed to collectives for gradients (what goes on
  // the wire before each backend's algorithm), and the buckets reduced,
  // since construction.
  int64_t bytes_sent() const {
    return bytes_.load(std::memory_order_relaxed);
  }
  int64_t buckets_reduced() const {
    return buckets_.load(std::memory_order_relaxed);
  }

 protected:
  // For reduce(): counts a collective's input.
  void count_bytes(int64_t bytes) {
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void count_bucket() {
    buckets_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> buckets_{0};
};

// The default: one all-reduce of the whole bucket.
std::shared_ptr<CommHook> allreduce_hook();
// The bucket travels as float16 or bfloat16 (floating buckets of 32 or 64
// bits; others as they are) and is cast back after the all-reduce.
std::shared_ptr<CommHook> fp16_compress_hook();
std::shared_ptr<CommHook> bf16_compress_hook();

// PowerSGD (Vogels et al., NeurIPS 2019), as DDP's powerSGD_hook: each
// gradient of two or more dimensions, seen as a matrix M (n = dim 0, m =
// the rest), goes as P = M Q (n x rank) and Q = M^T P (m x rank), one
// power iteration with P orthogonalized in between; the rank's residual is
// kept and added to the next step's gradient (error feedback).
struct PowerSGDOptions {
  // The approximation's rank: 1 sends the least.
  TORCH_ARG(int64_t, rank) = 1;
  // Steps of plain all-reduce first (DDP's start_powerSGD_iter): the
  // approximation is poor while gradients change fast.
  TORCH_ARG(int64_t, start_iter) = 1000;
  // A matrix is compressed only if n*m >= min_compression_rate *
  // (n+m)*rank; the others, and 1-D gradients, are all-reduced as they are.
  TORCH_ARG(double, min_compression_rate) = 2;
  TORCH_ARG(bool, error_feedback) = true;
  // Start each step's power iteration from the last step's Q (one
  // iteration then suffices); off: a fresh random Q each step.
  TORCH_ARG(bool, warm_start) = true;
  // Added to each column's norm when orthogonalizing (a zero column stays
  // zero either way).
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  // Seeds the random initial Q: the same on every rank (checked).
  TORCH_ARG(uint64_t, seed) = 0;
};

std::shared_ptr<CommHook> powersgd_hook(const PowerSGDOptions& options = {});

}  // namespace ronde
