// elastic::State and run(): commits are LibTorch archives of the state's
// entries held in memory; a change of world (change_world, in init.cpp) is
// followed by the world-dependent pieces adapting and rank 0's commit
// becoming every rank's.
#include <ronde/elastic.h>

#include <ronde/collectives.h>
#include <ronde/data.h>
#include <ronde/errors.h>
#include <ronde/optimizer.h>
#include <ronde/runtime.h>

#include "runtime/span.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <iostream>
#include <sstream>

namespace ronde::elastic {

State::State() : entries_("(elastic state in memory)", 0) {}

State& State::add(const std::string& name, torch::nn::Module& module) {
  entries_.add(name, module);
  return *this;
}

State& State::add(const std::string& name, DistributedOptimizer& optimizer) {
  entries_.add(name, static_cast<torch::optim::Optimizer&>(optimizer));
  optimizers_.push_back(&optimizer);
  return *this;
}

State& State::add(
    const std::string& name, torch::optim::Optimizer& optimizer) {
  if (auto* d = dynamic_cast<DistributedOptimizer*>(&optimizer))
    return add(name, *d);
  entries_.add(name, optimizer);
  return *this;
}

State& State::add(const std::string& name, WarmupScheduler& scheduler) {
  entries_.add(name, scheduler);
  return *this;
}

State& State::add(const std::string& name, GradScaler& scaler) {
  entries_.add(name, scaler);
  return *this;
}

State& State::add(const std::string& name, DistributedSampler& sampler) {
  entries_.add(name, sampler);
  samplers_.push_back(&sampler);
  return *this;
}

State& State::add(const std::string& name, int64_t& counter) {
  entries_.add(name, counter);
  return *this;
}

State& State::add(
    const std::string& name,
    std::function<void(torch::serialize::OutputArchive&)> save,
    std::function<void(torch::serialize::InputArchive&)> load) {
  entries_.add(name, std::move(save), std::move(load));
  return *this;
}

State& State::on_reset(std::function<void()> callback) {
  TORCH_CHECK(callback, "ronde: elastic::State::on_reset needs a callback");
  callbacks_.push_back(std::move(callback));
  return *this;
}

void State::commit() {
  detail::Span span("ronde::commit", "elastic commit", "elastic");
  torch::serialize::OutputArchive archive;
  entries_.write_entries(archive);
  std::string bytes;
  bytes.reserve(committed_.size());
  archive.save_to([&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  committed_ = std::move(bytes);
  ++commits_;
}

void State::restore() {
  TORCH_CHECK(
      !committed_.empty(),
      "ronde: elastic::State::restore() before any commit()");
  torch::serialize::InputArchive archive;
  {
    // From a copy in a stream: loaded tensors may alias the bytes read.
    std::istringstream stream(committed_);
    archive.load_from(stream);
  }
  entries_.read_entries(archive, "the elastic commit");
}

void State::sync() {
  detail::Span span("ronde::sync", "elastic sync", "elastic");
  if (is_initialized() && size() > 1) {
    auto length =
        at::tensor({static_cast<int64_t>(committed_.size())}, at::kLong);
    broadcast_(length, 0, CollectiveOptions().name("ronde.elastic.length"));
    auto bytes = at::empty({length.item<int64_t>()}, at::kByte);
    if (rank() == 0 && !committed_.empty())
      std::memcpy(bytes.data_ptr<uint8_t>(), committed_.data(), bytes.numel());
    if (bytes.numel() > 0) {
      broadcast_(bytes, 0, CollectiveOptions().name("ronde.elastic.state"));
      committed_.assign(
          reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
          bytes.numel());
    } else {
      committed_.clear();
    }
  }
  if (!committed_.empty())
    restore();
}

void State::reset() {
  for (DistributedOptimizer* o : optimizers_)
    o->adapt_to_world();
  for (DistributedSampler* s : samplers_)
    s->adapt_to_world();
  sync();
  ++resets_;
  for (const auto& callback : callbacks_)
    callback();
}

void run(State& state, const std::function<void()>& train) {
  TORCH_CHECK(train, "ronde: elastic::run needs a function to run");
  TORCH_CHECK(
      is_initialized(), "ronde: elastic::run needs ronde::init() first");
  state.commit();
  bool started = false;
  bool changed = false;
  for (;;) {
    // A failure while the state is synced (at the start, or after a
    // change of world) is one more change of world, as one in train.
    try {
      if (changed) {
        changed = false;
        state.reset();
      } else if (!started) {
        state.sync();
      }
      started = true;
      train();
      return;
    } catch (const CommError& e) {
      std::cerr << "ronde: rank " << rank() << ": " << e.what()
                << "; forming a new world without the ranks that failed"
                << std::endl;
      // Throws, ending run(), when the job cannot go on.
      const WorldChange change = change_world(e.suspect_ranks());
      if (rank() == 0) {
        std::cerr << "ronde: elastic epoch " << change.epoch << ": "
                  << change.size << " rank(s), " << change.old_size
                  << " before" << std::endl;
      }
      started = true;
      changed = true;
    }
  }
}

}  // namespace ronde::elastic
