// Data sharding: each rank reads its own part of a dataset, reshuffled every
// epoch with a seed every rank shares, and every rank runs the same number of
// steps.
#pragma once

#include <torch/arg.h>
#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>

#include <cstddef>
#include <optional>
#include <vector>

namespace ronde {

struct DistributedSamplerOptions {
  TORCH_ARG(bool, shuffle) = true;
  // Same on every rank: the permutation of epoch e uses seed + e.
  TORCH_ARG(int64_t, seed) = 0;
  // true: drop the tail that does not divide by the replicas; false: pad it
  // by repeating the first indices, so no sample is lost.
  TORCH_ARG(bool, drop_last) = false;
  // -1: ronde::rank() / ronde::size() (0 / 1 before init()).
  TORCH_ARG(int64_t, rank) = -1;
  TORCH_ARG(int64_t, replicas) = -1;
};

// A LibTorch sampler: torch::data::make_data_loader(dataset, sampler, opts).
// Rank r reads positions r, r + n, r + 2n, ... of the epoch's permutation.
// When the world changes within an epoch (elastic training), what is left
// of the permutation is split the same way over the new ranks: every
// sample of the epoch is still read once.
class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  DistributedSampler(
      size_t dataset_size, DistributedSamplerOptions options = {});

  // Chooses the permutation of this epoch; call before each epoch.
  void set_epoch(int64_t epoch);
  void reset(std::optional<size_t> new_size = std::nullopt) override;
  std::optional<std::vector<size_t>> next(size_t batch_size) override;
  // save() keeps the epoch and how far into it the job has read; load()
  // splits the rest of that epoch over this sampler's ranks, which may be
  // more or fewer than those of the job that saved.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // Takes this rank's place in the world as it is now (ronde::rank() and
  // ronde::size(), unless the options fixed them) and splits the rest of
  // the epoch over it. elastic::State calls it after a change of world.
  void adapt_to_world();

  // Samples this rank reads in this epoch from where the current split
  // began (the epoch's start, unless the world changed or a checkpoint was
  // loaded within it): the same on every rank.
  size_t num_samples() const {
    return indices_.size();
  }
  // Samples this rank has read since the split began.
  size_t position() const {
    return position_;
  }
  // Samples of the epoch's permutation the whole job has read (at most the
  // dataset's size): where the next split would begin.
  size_t consumed() const;
  int64_t epoch() const {
    return epoch_;
  }
  const std::vector<size_t>& indices() const {
    return indices_;
  }

 private:
  void build();
  size_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t rank_;
  int64_t replicas_;
  int64_t epoch_ = 0;
  std::vector<size_t> indices_;
  size_t position_ = 0;
  // Where in the epoch's permutation the current split begins.
  size_t start_ = 0;
};

}  // namespace ronde
