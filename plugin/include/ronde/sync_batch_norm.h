// Batch norm over the global batch: in training mode, the statistics of
// every rank's rows together, as one torch::nn::BatchNorm over the
// concatenated batch would compute them (Horovod's SyncBatchNorm, PyTorch's
// nn.SyncBatchNorm), with the same state as torch::nn::BatchNorm{1,2,3}d.
#pragma once

#include <ronde/process_set.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>

namespace ronde {
namespace nn {

// Inputs (N, C, ...) of 2 to 5 dimensions, as BatchNorm1d/2d/3d take.
// Forward in training mode gathers every rank's per-channel (count, mean,
// M2) in one allgather (float64) and combines them exactly in rank order
// (Chan et al.'s parallel form: mean = sum(n_r mean_r) / N, M2 = sum(M2_r
// + n_r (mean_r - mean)^2)), so ranks with different batch sizes (a last
// batch) weigh by their rows and every rank gets the same bits; each rank's
// own statistics are float32 at least (float16/bfloat16 inputs, under
// autocast, are promoted). The running statistics take the unbiased global
// variance, as BatchNorm over the whole batch. Backward all-reduces the two
// per-channel sums the input gradient needs (one call); the weight and
// bias gradients stay this rank's (the DistributedOptimizer averages
// them). Eval mode, a job of one rank and a set of one use the running
// statistics (or local batch ones) with no communication. The collectives
// are named after the module's construction order, the same on ranks that
// build the same model.
class SyncBatchNormImpl
    : public torch::nn::
          NormImplBase<2, SyncBatchNormImpl, torch::nn::BatchNormOptions> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features)) {}
  // `process_set`: the ranks whose rows make the batch (default: the job).
  explicit SyncBatchNormImpl(
      const torch::nn::BatchNormOptions& options, ProcessSet process_set = {});

  torch::Tensor forward(const torch::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

  // Makes these tensors themselves this module's parameters (so an
  // optimizer holding them trains this module) and copies the buffers'
  // values: what convert_sync_batchnorm() uses to keep a BatchNorm's state.
  void share_state(
      const torch::Tensor& weight,
      const torch::Tensor& bias,
      const torch::Tensor& running_mean,
      const torch::Tensor& running_var,
      const torch::Tensor& num_batches_tracked);

  const ProcessSet& process_set() const {
    return process_set_;
  }

 protected:
  void _check_input_dim(const torch::Tensor& input) override;

 private:
  ProcessSet process_set_;
  std::string name_;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace nn

// Replaces every BatchNorm1d/2d/3d below `module`, in place, by a
// SyncBatchNorm with its options, parameters and running statistics
// (parameters shared, so an optimizer made before still updates them;
// running statistics copied), and returns how many it
// replaced. LibTorch modules call their children through their own
// members, not through the registry: a child can be swapped where the
// registry is what calls it, inside a Sequential (whose entries are
// swapped too) or registered only; a BatchNorm its parent also keeps in a
// member is refused with a c10::Error naming it (declare that one as
// ronde::nn::SyncBatchNorm). `module` itself is not replaced.
int64_t convert_sync_batchnorm(
    torch::nn::Module& module, const ProcessSet& process_set = {});

}  // namespace ronde
