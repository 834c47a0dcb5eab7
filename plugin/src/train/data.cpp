// DistributedSampler: the shared permutation, padded or trimmed to a multiple
// of the replicas, read with a stride.
#include <ronde/data.h>

#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

namespace ronde {

DistributedSampler::DistributedSampler(
    size_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  replicas_ = options_.replicas() >= 0 ? options_.replicas()
                                       : (is_initialized() ? size() : 1);
  rank_ =
      options_.rank() >= 0 ? options_.rank() : (is_initialized() ? rank() : 0);
  build();
}

void DistributedSampler::build() {
  TORCH_CHECK(replicas_ >= 1, "ronde: DistributedSampler needs replicas >= 1");
  TORCH_CHECK(
      rank_ < replicas_,
      "ronde: DistributedSampler rank ",
      rank_,
      " must be smaller than replicas ",
      replicas_);
  TORCH_CHECK(
      !options_.drop_last() || dataset_size_ >= static_cast<size_t>(replicas_),
      "ronde: a dataset of ",
      dataset_size_,
      " samples cannot give ",
      replicas_,
      " replicas one sample each with drop_last");
  std::vector<size_t> order(dataset_size_);
  if (options_.shuffle()) {
    auto gen =
        at::make_generator<at::CPUGeneratorImpl>(options_.seed() + epoch_);
    at::Tensor perm = at::randperm(
        static_cast<int64_t>(dataset_size_),
        gen,
        at::TensorOptions().dtype(at::kLong));
    const int64_t* p = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < dataset_size_; ++i)
      order[i] = static_cast<size_t>(p[i]);
  } else {
    for (size_t i = 0; i < dataset_size_; ++i)
      order[i] = i;
  }
  // The split covers the permutation from start_, trimmed or padded (with
  // the epoch's first samples) to a multiple of the replicas.
  const size_t n = static_cast<size_t>(replicas_);
  start_ = std::min(start_, dataset_size_);
  const size_t left = dataset_size_ - start_;
  const size_t total =
      start_ +
      (options_.drop_last() ? (left / n) * n : ((left + n - 1) / n) * n);
  order.resize(std::min(total, order.size()));
  for (size_t i = 0; order.size() < total && dataset_size_ > 0; ++i) {
    order.push_back(order[i % dataset_size_]);
  }
  indices_.clear();
  for (size_t i = start_ + static_cast<size_t>(rank_); i < order.size();
       i += n) {
    indices_.push_back(order[i]);
  }
  position_ = 0;
}

size_t DistributedSampler::consumed() const {
  return std::min(
      dataset_size_, start_ + position_ * static_cast<size_t>(replicas_));
}

void DistributedSampler::adapt_to_world() {
  const size_t done = consumed();
  if (options_.replicas() < 0)
    replicas_ = is_initialized() ? size() : 1;
  if (options_.rank() < 0)
    rank_ = is_initialized() ? rank() : 0;
  start_ = done;
  build();
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  start_ = 0;
  build();
}

void DistributedSampler::reset(std::optional<size_t> new_size) {
  if (new_size)
    dataset_size_ = *new_size;
  start_ = 0;
  build();
}

std::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (position_ >= indices_.size())
    return std::nullopt;
  size_t end = std::min(indices_.size(), position_ + batch_size);
  std::vector<size_t> batch(
      indices_.begin() + position_, indices_.begin() + end);
  position_ = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("ronde_sampler_epoch", at::tensor({epoch_}, at::kLong));
  archive.write(
      "ronde_sampler_position",
      at::tensor({static_cast<int64_t>(position_)}, at::kLong));
  archive.write(
      "ronde_sampler_consumed",
      at::tensor({static_cast<int64_t>(consumed())}, at::kLong));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch, position, consumed;
  archive.read("ronde_sampler_epoch", epoch);
  archive.read("ronde_sampler_position", position);
  epoch_ = epoch.item<int64_t>();
  // Files from before the consumed count: the saving job had this
  // sampler's replicas, and read `position` samples each from the start.
  start_ = archive.try_read("ronde_sampler_consumed", consumed)
               ? static_cast<size_t>(consumed.item<int64_t>())
               : static_cast<size_t>(position.item<int64_t>()) *
                     static_cast<size_t>(replicas_);
  build();
}

}  // namespace ronde
