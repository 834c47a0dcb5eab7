// The built-in communication hooks but PowerSGD (powersgd.cpp), and how the
// engine launches a bucket through its hook: on the set's communication
// thread for host buckets (comm/jobs.h, submit_task), on the launching
// thread for device ones.
#include "engine/comm_hooks.h"

#include "comm/collective_calls.h"
#include "comm/comm_worker.h"
#include "comm/jobs.h"
#include "engine/blobs.h"
#include "engine/gradient_engine.h"
#include "runtime/span.h"

#include <ronde/comm_hook.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <iostream>

#include <mutex>
#include <set>

namespace ronde {

void CommHook::save(torch::serialize::OutputArchive&) const {}
void CommHook::load(torch::serialize::InputArchive&) {}

namespace {

class AllreduceHook : public CommHook {
 public:
  std::string name() const override {
    return "allreduce";
  }
  void reduce(CommBucket& bucket) override {
    count_bucket();
    count_bytes(bucket.buffer.numel() * bucket.buffer.element_size());
    allreduce_async_(bucket.buffer, bucket.options).wait();
  }
};

// The bucket goes as `wire_` when it is float32 or float64, and comes back
// cast to its own type: what Compression::FP16/BF16 always did. A host
// bucket is cast into one wire buffer kept for every bucket (the buckets
// go one at a time, each done when its all-reduce returns), as large as
// the largest and made where the set reduces it in place (the
// shared-memory arena): a fresh one per bucket cost a page fault per page
// under glibc's defaults (84 MB cast in 64.6 ms against 10.9 into a kept
// buffer) and was copied into shared memory and back.
class CastHook : public CommHook {
 public:
  explicit CastHook(at::ScalarType wire) : wire_(wire) {}
  std::string name() const override {
    return wire_ == at::kHalf ? "fp16" : "bf16";
  }
  void reduce(CommBucket& bucket) override {
    count_bucket();
    const at::Tensor& buffer = bucket.buffer;
    if (buffer.scalar_type() != at::kFloat &&
        buffer.scalar_type() != at::kDouble) {
      count_bytes(buffer.numel() * buffer.element_size());
      allreduce_async_(buffer, bucket.options).wait();
      return;
    }
    at::Tensor wire;
    {
      detail::Span compress("ronde::compress");
      if (buffer.device().is_cpu()) {
        const int64_t n = buffer.numel();
        if (!kept_.defined() || kept_.numel() < n) {
          kept_ = at::Tensor();  // its memory back before the larger one
          kept_ = detail::bucket_zeros(
              bucket.process_set, n, buffer.options().dtype(wire_));
        }
        wire = kept_.narrow(0, 0, n);
        wire.copy_(buffer);
      } else {
        wire = buffer.to(wire_);
      }
      if (compress.timing())
        compress.timeline("compress " + bucket.options.name(), "pack");
    }
    count_bytes(wire.numel() * wire.element_size());
    allreduce_async_(wire, bucket.options).wait();
    buffer.copy_(wire);
  }

 private:
  const at::ScalarType wire_;
  at::Tensor kept_;  // the host wire buffer
};

// The hooks in use, each by one engine at a time: PowerSGD's state is one
// optimizer's.
std::mutex claimed_mutex;
std::set<const CommHook*> claimed;

}  // namespace

std::shared_ptr<CommHook> allreduce_hook() {
  return std::make_shared<AllreduceHook>();
}
std::shared_ptr<CommHook> fp16_compress_hook() {
  return std::make_shared<CastHook>(at::kHalf);
}
std::shared_ptr<CommHook> bf16_compress_hook() {
  return std::make_shared<CastHook>(at::kBFloat16);
}

namespace detail {

std::shared_ptr<CommHook> choose_hook(
    const DistributedOptimizerOptions& options) {
  if (options.comm_hook()) {
    TORCH_CHECK(
        options.compression() == Compression::None,
        "ronde: DistributedOptimizer on rank ",
        ronde::rank(),
        ": both compression and comm_hook are set; the fp16 and bf16 hooks "
        "are what compression does");
    return options.comm_hook();
  }
  switch (options.compression()) {
    case Compression::FP16:
      return fp16_compress_hook();
    case Compression::BF16:
      return bf16_compress_hook();
    case Compression::None:
      break;
  }
  return allreduce_hook();
}

HookClaim::HookClaim(std::shared_ptr<CommHook> hook) : hook_(std::move(hook)) {
  std::lock_guard<std::mutex> lock(claimed_mutex);
  TORCH_CHECK(
      claimed.insert(hook_.get()).second,
      "ronde: the communication hook '",
      hook_->name(),
      "' on rank ",
      ronde::rank(),
      " already serves another optimizer; give each its own");
}

HookClaim::~HookClaim() {
  std::lock_guard<std::mutex> lock(claimed_mutex);
  claimed.erase(hook_.get());
}

Handle launch_comm_hook(std::shared_ptr<CommHook> hook, CommBucket bucket) {
  if (!bucket.buffer.is_cpu()) {
    // Device work is queued on streams: the hook's collectives and waits
    // order themselves, so it runs here without blocking the host.
    hook->reduce(bucket);
    auto done = std::make_shared<HandleState>();
    done->finish(nullptr);
    return Handle(done);
  }
  const ProcessSet set = bucket.process_set;
  std::string what =
      "comm hook " + hook->name() + " '" + bucket.options.name() + "'";
  return submit_task(
      set,
      [hook = std::move(hook), bucket = std::move(bucket)]() mutable {
        hook->reduce(bucket);
      },
      std::move(what));
}

Handle GradientEngine::launch_hooked(size_t bi, const AllreduceOptions& opts) {
  const LayoutBucket& b = layout_.buckets[bi];
  CommBucket bucket;
  bucket.buffer = b.buffer;
  for (size_t slot : b.slots) {
    const LayoutSlot& s = layout_.slots[slot];
    bucket.gradients.push_back(s.view);
    bucket.names.push_back(names_[s.index]);
    bucket.parameters.push_back(s.index);
  }
  bucket.index = bi;
  bucket.last = bi + 1 == layout_.buckets.size();
  bucket.step = steps_;
  bucket.process_set = options_.process_set();
  bucket.options = opts;
  return launch_comm_hook(hook_.hook(), std::move(bucket));
}

namespace {

at::Tensor tensor_of(const std::string& bytes) {
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  if (!bytes.empty())
    std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return t;
}

std::string string_of(const at::Tensor& t) {
  const auto* p = reinterpret_cast<const char*>(t.data_ptr<uint8_t>());
  return std::string(p, p + t.numel());
}

std::string own_state(const CommHook& hook) {
  torch::serialize::OutputArchive out;
  hook.save(out);
  return bytes_of(out);
}

}  // namespace

void GradientEngine::consolidate_hook_state(int to) {
  const std::string mine = own_state(*hook_.hook());
  std::vector<std::string> all =
      exchange_blobs(mine, options_.process_set(), to);
  std::lock_guard<std::mutex> lock(mutex_);
  hook_states_ = std::move(all);
}

// Under "ronde_comm_hook": the hook's name, then either every rank's state
// ("ranks" of them, "rank_<r>") or this rank's ("self"), as bytes.
void GradientEngine::save_hook_state(
    torch::serialize::OutputArchive& archive) const {
  const CommHook& hook = *hook_.hook();
  if (!hook.stateful())
    return;
  torch::serialize::OutputArchive sub;
  sub.write("name", c10::IValue(hook.name()));
  std::vector<std::string> states;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    states = hook_states_;
  }
  if (states.empty()) {
    sub.write("self", tensor_of(own_state(hook)));
  } else {
    sub.write("ranks", c10::IValue(static_cast<int64_t>(states.size())));
    for (size_t r = 0; r < states.size(); ++r)
      sub.write("rank_" + std::to_string(r), tensor_of(states[r]));
  }
  archive.write("ronde_comm_hook", sub);
}

void GradientEngine::load_hook_state(torch::serialize::InputArchive& archive) {
  CommHook& hook = *hook_.hook();
  if (!hook.stateful())
    return;
  torch::serialize::InputArchive sub;
  c10::IValue name, ranks;
  at::Tensor bytes;
  const ProcessSet& set = options_.process_set();
  const bool found = archive.try_read("ronde_comm_hook", sub) &&
                     sub.try_read("name", name) && name.isString() &&
                     name.toStringRef() == hook.name();
  if (found && ((sub.try_read("ranks", ranks) && ranks.toInt() == set.size() &&
                 sub.try_read("rank_" + std::to_string(set.rank()), bytes)) ||
                sub.try_read("self", bytes))) {
    torch::serialize::InputArchive in;
    load_bytes(in, string_of(bytes));
    hook.load(in);
    return;
  }
  if (found) {
    std::cerr << "ronde: warning: rank " << ronde::rank()
              << ": the checkpoint's " << hook.name()
              << " state is of a job of " << (ranks.isInt() ? ranks.toInt() : 0)
              << " ranks; it starts afresh in this one of " << set.size()
              << std::endl;
  }
  hook.reset();
}

}  // namespace detail
}  // namespace ronde
