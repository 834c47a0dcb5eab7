// elastic::State and run(): commits are LibTorch archives of the state's
// entries held in memory; a change of world (change_world, in init/elastic.cpp)
// is followed by the world-dependent pieces adapting and rank 0's commit
// becoming every rank's.
#include <ronde/elastic.h>

#include <ronde/collectives.h>
#include <ronde/data.h>
#include <ronde/errors.h>
#include <ronde/optimizer.h>
#include <ronde/runtime.h>

#include "runtime/span.h"
#include "train/archive_access.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <iostream>
#include <sstream>
#include <unordered_map>

namespace ronde::elastic {

// A commit is the archive the entries write, kept as its module: the
// tree of values an archive file would hold, each tensor copied. The copy
// of a tensor is reused by the next commit while the tensor keeps its
// shape, so a commit after the first allocates nothing and costs about a
// memcpy of the state; no zip file is written until a sync needs bytes.
struct State::Commit {
  c10::IValue tree;  // none before the first commit
  std::unordered_map<const c10::TensorImpl*, at::Tensor> copies;
  size_t bytes = 0;
};

State::State()
    : entries_("(elastic state in memory)", 0),
      commit_(std::make_shared<Commit>()) {}

size_t State::committed_bytes() const {
  return commit_->bytes;
}

State& State::add(const std::string& name, torch::nn::Module& module) {
  entries_.add(name, module);
  return *this;
}

State& State::add(const std::string& name, DistributedOptimizer& optimizer) {
  TORCH_CHECK(
      !optimizer.sharded(),
      "ronde: elastic::State cannot hold a sharded DistributedOptimizer ('",
      name,
      "', rank ",
      ronde::rank(),
      "): a lost rank's shard of the optimizer state would be lost with it");
  entries_.add(name, static_cast<torch::optim::Optimizer&>(optimizer));
  optimizers_.push_back(&optimizer);
  return *this;
}

State& State::add(const std::string& name, torch::optim::Optimizer& optimizer) {
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
  save();
  if (check_host_updates())
    throw HostsUpdatedInterrupt();
}

void State::save() {
  detail::Span span("ronde::commit", "elastic commit", "elastic");
  torch::serialize::OutputArchive archive;
  entries_.write_entries(archive);
  const c10::IValue tree = detail::module_of(archive)._ivalue();
  torch::NoGradGuard no_grad;
  c10::IValue::HashIdentityIValueMap memo;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> copies;
  size_t bytes = 0;
  tree.visit([&](const c10::IValue& v) {
    if (!v.isTensor() || memo.count(v))
      return false;
    const at::Tensor& live = v.toTensor();
    if (!live.defined()) {
      memo[v] = v;
      return false;
    }
    auto it = commit_->copies.find(live.unsafeGetTensorImpl());
    at::Tensor copy;
    if (it != commit_->copies.end() && it->second.sizes() == live.sizes() &&
        it->second.strides() == live.strides() &&
        it->second.dtype() == live.dtype() &&
        it->second.device() == live.device()) {
      copy = it->second;
      copy.copy_(live);
    } else {
      copy = live.clone(at::MemoryFormat::Preserve);
    }
    memo[v] = copy;
    copies[live.unsafeGetTensorImpl()] = copy;
    bytes += copy.nbytes();
    return false;
  });
  commit_->tree = tree.deepcopy(memo);
  commit_->copies = std::move(copies);
  commit_->bytes = bytes;
  ++commits_;
}

void State::restore() {
  TORCH_CHECK(
      commit_->tree.isObject(),
      "ronde: elastic::State::restore() before any commit()");
  torch::serialize::InputArchive archive;
  {
    // A copy: what is read into a module's parameters takes their place,
    // and the commit must stay apart from training.
    torch::NoGradGuard no_grad;
    detail::module_of(archive) =
        torch::jit::Module(commit_->tree.deepcopy().toObject());
  }
  entries_.read_entries(archive, "the elastic commit");
}

void State::sync() {
  detail::Span span("ronde::sync", "elastic sync", "elastic");
  if (is_initialized() && size() > 1) {
    std::string bytes;
    if (rank() == 0 && commit_->tree.isObject()) {
      torch::serialize::OutputArchive out;
      detail::module_of(out) = torch::jit::Module(commit_->tree.toObject());
      out.save_to([&bytes](const void* data, size_t n) {
        bytes.append(static_cast<const char*>(data), n);
        return n;
      });
    }
    auto length = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
    broadcast_(length, 0, CollectiveOptions().name("ronde.elastic.length"));
    auto wire = at::empty({length.item<int64_t>()}, at::kByte);
    if (rank() == 0 && !bytes.empty())
      std::memcpy(wire.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    if (wire.numel() > 0) {
      broadcast_(wire, 0, CollectiveOptions().name("ronde.elastic.state"));
      if (rank() != 0) {
        // From a stream: tensors loaded from a buffer may alias it.
        std::istringstream stream(std::string(
            reinterpret_cast<const char*>(wire.data_ptr<uint8_t>()),
            static_cast<size_t>(wire.numel())));
        torch::serialize::InputArchive in;
        in.load_from(stream);
        commit_->tree = detail::module_of(in)._ivalue();
        commit_->copies.clear();
        commit_->bytes = 0;
        commit_->tree.visit([this](const c10::IValue& v) {
          if (v.isTensor() && v.toTensor().defined())
            commit_->bytes += v.toTensor().nbytes();
          return false;
        });
      }
    } else {
      commit_->tree = c10::IValue();
      commit_->copies.clear();
      commit_->bytes = 0;
    }
  }
  if (commit_->tree.isObject())
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

namespace {

void report(const WorldChange& change, const char* how) {
  if (rank() == 0) {
    std::cerr << "ronde: elastic epoch " << change.epoch << ": " << change.size
              << " rank(s), " << change.old_size << " before" << how
              << std::endl;
  }
}

}  // namespace

void run(State& state, const std::function<void()>& train) {
  TORCH_CHECK(train, "ronde: elastic::run needs a function to run");
  TORCH_CHECK(
      is_initialized(), "ronde: elastic::run needs ronde::init() first");
  bool changed = false;
  if (joining()) {
    const WorldChange change = join_world();
    if (change.rank < 0)
      return;  // the job finished before it could take this process
    changed = true;
  } else {
    state.save();
  }
  bool started = changed;
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
      if (rank() == 0)
        close_to_joiners();
      return;
    } catch (const HostsUpdatedInterrupt&) {
      report(admit_joiners(), " (ranks joined)");
      started = true;
      changed = true;
    } catch (const CommError& e) {
      std::cerr << "ronde: rank " << rank() << ": " << e.what()
                << "; forming a new world without the ranks that failed"
                << std::endl;
      // Throws, ending run(), when the job cannot go on.
      report(change_world(e.suspect_ranks()), "");
      started = true;
      changed = true;
    }
  }
}

}  // namespace ronde::elastic
