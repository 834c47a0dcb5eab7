// Between steps the engine lays its buckets out again: once after the first
// step, in the order the hooks fired (rank 0's), and at each autotune
// trial's end with rank 0's next sizes. Every rank adopts rank 0's choice,
// so the layouts never split (the finish_step item of the section below).
// See docs/architecture.md, "One gradient, from its hook to the optimizer step"
#include "engine/gradient_engine.h"

#include "comm/collective_calls.h"

#include <ronde/collectives.h>
#include <ronde/runtime.h>
#include <ronde/timeline.h>

#include <ATen/ATen.h>

#include <chrono>
#include <iostream>
#include <sstream>

namespace ronde::detail {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::vector<size_t> GradientEngine::current_order_locked() const {
  std::vector<size_t> order;
  for (const LayoutSlot& s : layout_.slots)
    order.push_back(s.index);
  return order;
}

// The parameters in the order they became ready, then those that did not
// (unused in the first step) in their current order; rank 0's list wins.
std::vector<size_t> GradientEngine::agreed_order_locked() {
  std::vector<char> seen(names_.size(), 0);
  std::vector<int64_t> order;
  for (size_t i : ready_order_) {
    if (!seen[i]) {
      seen[i] = 1;
      order.push_back(static_cast<int64_t>(i));
    }
  }
  for (size_t i : current_order_locked()) {
    if (!seen[i])
      order.push_back(static_cast<int64_t>(i));
  }
  ready_order_.clear();
  ready_order_.shrink_to_fit();
  at::Tensor t = at::tensor(order, at::kLong);
  const ProcessSet& set = options_.process_set();
  if (set.size() > 1) {
    ronde::broadcast_(
        t, 0, CollectiveOptions().name("ronde.bucket_order").process_set(set));
  }
  std::vector<size_t> out;
  const int64_t* v = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    out.push_back(static_cast<size_t>(v[i]));
  return out;
}

void GradientEngine::autotune_decide_locked() {
  double msg[3] = {0, 0, 0};
  const ProcessSet& set = options_.process_set();
  const bool decides = set.rank() == 0;
  if (decides) {
    const BucketSizes next = tuner_->next();
    msg[0] = next.fusion_mb;
    msg[1] = next.first_mb;
    msg[2] = tuner_->done() ? 1 : 0;
  }
  at::Tensor t = at::from_blob(msg, {3}, at::kDouble);
  if (set.size() > 1) {
    ronde::broadcast_(
        t, 0, CollectiveOptions().name("ronde.autotune").process_set(set));
  }
  const BucketSizes next{msg[0], msg[1]};
  const bool done = msg[2] != 0;
  if (!decides)
    tuner_->adopt(next, done);
  sizes_ = next;
  if (!done)
    return;
  autotuned_ = true;
  if (decides) {
    std::ostringstream line;
    line << "ronde: autotune chose bucket " << next.fusion_mb
         << " MiB, first bucket " << next.first_mb << " MiB (median step "
         << tuner_->score(next) * 1e3 << " ms) after " << tuner_->trials()
         << " trials: " << tuner_->summary();
    std::cerr << line.str() << std::endl;
  }
  if (timeline_enabled()) {
    timeline_instant(
        "autotune chose bucket " + std::to_string(next.fusion_mb) + " MiB",
        "autotune");
  }
  tuner_.reset();
}

void GradientEngine::after_step_locked() {
  ++steps_;
  // Steps are timed only while autotune searches.
  const auto& clock = options_.autotune_clock();
  auto read_clock = [&] { return clock ? clock() : steady_seconds(); };
  const double now = tuner_ ? read_clock() : 0;
  bool relayout = false;
  std::vector<size_t> order;
  if (steps_ == 1 && options_.rebuild_buckets()) {
    order = agreed_order_locked();
    relayout = true;
  }
  if (tuner_) {
    if (steps_ == 1) {
      sizes_ = tuner_->current();
      relayout = true;
    } else if (tuner_->record(now - last_step_end_)) {
      const BucketSizes before = sizes_;
      autotune_decide_locked();
      relayout = relayout || !(before == sizes_);
    }
  }
  if (relayout)
    relayout_locked(order.empty() ? current_order_locked() : order);
  // The next step is timed from here: a relayout's cost is not its.
  if (tuner_)
    last_step_end_ = read_clock();
}

BufferZeros GradientEngine::buffer_zeros() const {
  return [set = options_.process_set()](
             int64_t numel, const at::TensorOptions& options) {
    return bucket_zeros(set, numel, options);
  };
}

void GradientEngine::relayout_locked(const std::vector<size_t>& order) {
  const size_t first_cap = mib_bytes(sizes_.first_mb);
  const size_t cap = mib_bytes(sizes_.fusion_mb);
  std::vector<at::Tensor> params(names_.size());
  for (const LayoutSlot& s : layout_.slots)
    params[s.index] = s.param;
  BucketLayout next = make_layout(
      names_,
      params,
      order,
      first_cap,
      cap,
      sharded_ ? kShardAlign : 1,
      !shard_gradients_,
      buffer_zeros());
  bool same = next.buckets.size() == layout_.buckets.size();
  for (size_t b = 0; same && b < next.buckets.size(); ++b) {
    same = next.buckets[b].slots.size() == layout_.buckets[b].slots.size();
    for (size_t pos = 0; same && pos < next.buckets[b].slots.size(); ++pos) {
      same = next.slots[next.buckets[b].slots[pos]].index ==
             layout_.slots[layout_.buckets[b].slots[pos]].index;
    }
  }
  if (same)
    return;
  torch::NoGradGuard no_grad;
  std::vector<SlotState> states(next.slots.size());
  for (size_t i = 0; i < names_.size(); ++i) {
    const LayoutSlot& old_slot = layout_.slots[layout_.slot_of[i]];
    const LayoutSlot& new_slot = next.slots[next.slot_of[i]];
    at::Tensor& grad = old_slot.param.mutable_grad();
    if (grad.defined() && grad.is_same(old_slot.view)) {
      new_slot.view.copy_(old_slot.view);
      grad = new_slot.view;
    }
    states[next.slot_of[i]] = std::move(slot_state_[layout_.slot_of[i]]);
  }
  slot_state_ = std::move(states);
  bucket_state_ = std::vector<BucketState>(next.buckets.size());
  layout_ = std::move(next);
  reset_buckets_locked();
  if (sharded_)
    make_shards_locked();  // the optimizer's state follows (shard_state.h)
  verified_ = false;       // new buckets: checked across ranks once more
  if (timeline_enabled()) {
    timeline_instant(
        "buckets laid out",
        "buckets",
        "\"buckets\":" + std::to_string(layout_.buckets.size()) +
            ",\"bucket_mb\":" + std::to_string(sizes_.fusion_mb) +
            ",\"first_mb\":" + std::to_string(sizes_.first_mb));
  }
}

void GradientEngine::adapt_to_world() {
  std::lock_guard<std::mutex> lock(mutex_);
  reset_locked();
  verified_ = false;
  // The hook's state belongs to the old world (a rank that joined has
  // none): every rank starts it afresh.
  hook_.hook()->reset();
  // [steps, bucket MiB, first bucket MiB, autotuned, order...], rank 0's.
  std::vector<double> msg = {
      static_cast<double>(steps_),
      sizes_.fusion_mb,
      sizes_.first_mb,
      autotuned_ ? 1.0 : 0.0};
  for (size_t i : current_order_locked())
    msg.push_back(static_cast<double>(i));
  at::Tensor t = at::tensor(msg, at::kDouble);
  const ProcessSet& set = options_.process_set();
  if (set.size() > 1) {
    ronde::broadcast_(
        t,
        0,
        CollectiveOptions().name("ronde.elastic.layout").process_set(set));
  }
  const double* v = t.data_ptr<double>();
  steps_ = static_cast<int64_t>(v[0]);
  sizes_ = {v[1], v[2]};
  autotuned_ = v[3] != 0;
  // A search cut by a change of world is not resumed: its trials timed
  // another world. The sizes in use stay.
  tuner_.reset();
  ready_order_.clear();
  std::vector<size_t> order;
  for (int64_t i = 4; i < t.numel(); ++i)
    order.push_back(static_cast<size_t>(v[i]));
  relayout_locked(order);
}

BucketSizing GradientEngine::bucket_sizing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return BucketSizing{sizes_.fusion_mb, sizes_.first_mb, autotuned_};
}

void GradientEngine::set_bucket_sizing(const BucketSizing& sizing) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(
      sizing.fusion_threshold_mb > 0 && sizing.first_bucket_mb > 0,
      "ronde: bucket sizes must be positive, got ",
      sizing.fusion_threshold_mb,
      " and ",
      sizing.first_bucket_mb,
      " MiB");
  TORCH_CHECK(
      next_launch_ == 0 && hooks_ == 0,
      "ronde: bucket sizes can change only between steps (rank ",
      ronde::rank(),
      ")");
  sizes_ = {sizing.fusion_threshold_mb, sizing.first_bucket_mb};
  if (sizing.autotuned) {
    autotuned_ = true;
    tuner_.reset();
  }
  relayout_locked(current_order_locked());
}

}  // namespace ronde::detail
