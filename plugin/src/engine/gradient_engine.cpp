// The gradient engine (see gradient_engine.h): hooks, packing, launching,
// waiting and unpacking; the relayout between steps is in relayout.cpp.
// Threads: on_ready() runs on autograd's threads, everything else on the
// caller's; mutex_ orders them (docs/thread_model.md, "Locks").
// See docs/architecture.md, "One gradient, from its hook to the optimizer step"
#include "engine/gradient_engine.h"

#include "engine/cross_rank_check.h"
#include "engine/pack.h"
#include "runtime/settings.h"
#include "runtime/span.h"

#include <ronde/runtime.h>
#include <ronde/timeline.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>

namespace ronde::detail {
namespace {

double fusion_mb(double option, const Settings& settings) {
  if (option > 0)
    return option;
  TORCH_CHECK(
      option == 0, "ronde: fusion_threshold_mb must be positive, got ", option);
  if (settings.fusion_threshold_bytes)
    return *settings.fusion_threshold_bytes / (1 << 20);
  return kDefaultFusionThresholdMb;
}

void check_options(const DistributedOptimizerOptions& o) {
  TORCH_CHECK(
      o.backward_passes_per_step() >= 1,
      "ronde: backward_passes_per_step must be >= 1, got ",
      o.backward_passes_per_step());
  TORCH_CHECK(
      o.op() == ReduceOp::Average || o.op() == ReduceOp::Sum,
      "ronde: DistributedOptimizer reduces with Average or Sum, got ",
      to_string(o.op()));
  TORCH_CHECK(
      o.gradient_predivide_factor() > 0,
      "ronde: gradient_predivide_factor must be positive, got ",
      o.gradient_predivide_factor());
  TORCH_CHECK(
      o.first_bucket_mb() > 0,
      "ronde: first_bucket_mb must be positive, got ",
      o.first_bucket_mb());
  TORCH_CHECK(
      o.autotune_warmup_steps() >= 0 && o.autotune_steps_per_trial() >= 1,
      "ronde: autotune needs autotune_warmup_steps >= 0 and "
      "autotune_steps_per_trial >= 1, got ",
      o.autotune_warmup_steps(),
      " and ",
      o.autotune_steps_per_trial());
}

}  // namespace

std::shared_ptr<GradientEngine> GradientEngine::create(
    std::vector<std::string> names,
    std::vector<at::Tensor> params,
    const DistributedOptimizerOptions& options) {
  check_options(options);
  TORCH_CHECK(
      options.process_set().included(),
      "ronde: DistributedOptimizer on rank ",
      ronde::rank(),
      ", which is not in its process set ",
      options.process_set().id());
  std::shared_ptr<CommHook> hook = choose_hook(options);
  const bool sharded =
      options.shard_optimizer_state() || options.shard_gradients();
  TORCH_CHECK(
      !sharded || !options.comm_hook() ||
          options.comm_hook()->name() == "allreduce",
      "ronde: DistributedOptimizer on rank ",
      ronde::rank(),
      ": a sharded optimizer reduce-scatters its buckets and takes no "
      "comm_hook (got '",
      options.comm_hook() ? options.comm_hook()->name() : "",
      "'); compression works there");
  std::vector<std::string> lines;
  for (size_t i = 0; i < names.size(); ++i)
    lines.push_back(describe_tensor(names[i], params[i]));
  check_same_everywhere(
      "DistributedOptimizer parameters", lines, options.process_set());
  // Apart, so that a mismatch of parameters counts parameters only.
  check_same_everywhere(
      "DistributedOptimizer comm_hook",
      {hook->describe()},
      options.process_set());
  std::shared_ptr<GradientEngine> engine(new GradientEngine(
      std::move(names),
      std::move(params),
      options,
      std::move(hook),
      settings()));
  // Hooks hold a weak pointer: an engine destroyed first leaves them inert,
  // and the destructor removes them anyway.
  for (size_t s = 0; s < engine->layout_.slots.size(); ++s) {
    const LayoutSlot& slot = engine->layout_.slots[s];
    auto accumulator = torch::autograd::impl::grad_accumulator(slot.param);
    TORCH_CHECK(
        accumulator,
        "ronde: no gradient accumulator for '",
        engine->names_[slot.index],
        "' (is it a leaf that requires grad?)");
    engine->hook(s, std::move(accumulator));
  }
  return engine;
}

GradientEngine::GradientEngine(
    std::vector<std::string> names,
    std::vector<at::Tensor> params,
    const DistributedOptimizerOptions& o,
    std::shared_ptr<CommHook> hook,
    const Settings& settings)
    : options_(o),
      names_(std::move(names)),
      hook_(std::move(hook)),
      bucket_copy_whole_(settings.bucket_copy_whole),
      sharded_(o.shard_optimizer_state() || o.shard_gradients()),
      shard_gradients_(o.shard_gradients()) {
  sizes_ = {fusion_mb(o.fusion_threshold_mb(), settings), o.first_bucket_mb()};
  if (settings.autotune.value_or(o.autotune())) {
    double total = 0;
    for (const auto& p : params)
      total += static_cast<double>(p.numel() * p.element_size());
    tuner_ = std::make_unique<Autotuner>(
        sizes_,
        total / (1 << 20),
        static_cast<int>(o.autotune_warmup_steps()),
        static_cast<int>(o.autotune_steps_per_trial()));
  }
  layout_ = make_layout(
      names_,
      params,
      reverse_order(params.size()),
      mib_bytes(sizes_.first_mb),
      mib_bytes(sizes_.fusion_mb),
      sharded_ ? kShardAlign : 1,
      !shard_gradients_,
      buffer_zeros());
  slot_state_.resize(layout_.slots.size());
  bucket_state_.resize(layout_.buckets.size());
  reset_locked();
  if (sharded_)
    make_shards_locked();
}

GradientEngine::~GradientEngine() {
  for (auto& s : slot_state_) {
    if (s.accumulator)
      s.accumulator->del_post_hook(s.hook_key);
  }
  // Let in-flight all-reduces finish before their buffers go away.
  for (auto& b : bucket_state_) {
    if (b.launched) {
      try {
        b.handle.wait();
      } catch (...) {
      }
    }
  }
}

void GradientEngine::hook(size_t slot, NodePtr accumulator) {
  SlotState& s = slot_state_[slot];
  if (s.accumulator)
    s.accumulator->del_post_hook(s.hook_key);
  std::weak_ptr<GradientEngine> weak = shared_from_this();
  const size_t param = layout_.slots[slot].index;
  s.accumulator = std::move(accumulator);
  s.hook_key = s.accumulator->add_post_hook(
      std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, param](
              const torch::autograd::variable_list& outputs,
              const torch::autograd::variable_list&) {
            if (auto engine = weak.lock())
              engine->on_ready(param);
            return outputs;
          }));
}

bool GradientEngine::used_here(size_t slot) const {
  return slot_state_[slot].passes > 0 &&
         layout_.slots[slot].param.grad().defined();
}

void GradientEngine::on_ready(size_t param) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t slot = layout_.slot_of[param];
  SlotState& s = slot_state_[slot];
  const std::string& name = names_[param];
  ++hooks_;
  TORCH_CHECK(
      !synchronized_,
      "ronde: a gradient of '",
      name,
      "' arrived after synchronize() and before step() on rank ",
      ronde::rank(),
      "; it would be lost");
  ++s.passes;
  const int64_t k = options_.backward_passes_per_step();
  TORCH_CHECK(
      s.passes <= k,
      "ronde: '",
      name,
      "' received ",
      s.passes,
      " backward passes without step() on rank ",
      ronde::rank(),
      ", but backward_passes_per_step is ",
      k);
  if (timeline_enabled()) {
    timeline_instant(
        "gradient " + name, "hook", "\"pass\":" + std::to_string(s.passes));
  }
  if (s.passes < k)
    return;  // accumulate locally
  if (steps_ == 0 && options_.rebuild_buckets())
    ready_order_.push_back(param);
  if (--bucket_state_[layout_.slots[slot].bucket].pending == 0)
    launch_ready();
}

// Moves the bucket's gradients into their segments, all in one batched copy
// (one concatenation when every segment is copied; nothing for a .grad that
// already is its segment), and zeroes the segments of parameters that got
// no gradient here.
void GradientEngine::pack(size_t bi) {
  const LayoutBucket& b = layout_.buckets[bi];
  Span span("ronde::pack");
  std::vector<at::Tensor> dst, src, unused;
  std::vector<const LayoutSlot*> moved;
  for (size_t slot : b.slots) {
    const LayoutSlot& s = layout_.slots[slot];
    at::Tensor& grad = s.param.mutable_grad();
    if (!used_here(slot)) {
      unused.push_back(s.view);  // contributes nothing, whatever it held
      continue;
    }
    if (grad.is_same(s.view))
      continue;
    dst.push_back(s.view);
    // A sparse gradient (a sparse embedding's) is reduced dense; the
    // parameter's .grad becomes dense too, where it is unpacked.
    src.push_back(grad.is_sparse() ? grad.to_dense() : grad);
    moved.push_back(&s);
  }
  if (!dst.empty())
    pack_segments(b.flat, dst, src, bucket_copy_whole_);
  if (!unused.empty())
    at::_foreach_zero_(unused);
  if (options_.gradient_as_bucket_view()) {
    for (const LayoutSlot* s : moved)
      s->param.mutable_grad() = s->view;
  }
  if (span.timing() && !(dst.empty() && unused.empty())) {
    span.timeline(
        "pack " + b.name, "pack", "\"tensors\":" + std::to_string(dst.size()));
  }
}

// The used flags: kernels on a device (a copy from host memory would wait
// for the whole stream), one copy on the CPU.
void GradientEngine::write_used_mask(size_t bi) {
  const LayoutBucket& b = layout_.buckets[bi];
  std::vector<float> used(b.slots.size());
  bool all_used = true;
  for (size_t pos = 0; pos < b.slots.size(); ++pos) {
    used[pos] = used_here(b.slots[pos]) ? 1.0f : 0.0f;
    all_used = all_used && used[pos] > 0;
  }
  if (b.mask.is_cpu()) {
    b.mask.copy_(at::from_blob(
        used.data(), {static_cast<int64_t>(used.size())}, at::kFloat));
  } else {
    b.mask.fill_(1);
    for (size_t pos = 0; pos < used.size() && !all_used; ++pos) {
      if (used[pos] == 0)
        b.mask.narrow(0, static_cast<int64_t>(pos), 1).zero_();
    }
  }
}

void GradientEngine::launch_ready() {
  while (next_launch_ < layout_.buckets.size() &&
         bucket_state_[next_launch_].pending == 0) {
    launch(next_launch_++);
  }
}

GradientEngine::ReduceFactors GradientEngine::reduce_factors() const {
  const double f = options_.gradient_predivide_factor();
  double post = f;
  const int64_t k = options_.backward_passes_per_step();
  if (k > 1 && options_.average_aggregated_gradients())
    post /= k;
  ReduceOp op = options_.op();
  if (op == ReduceOp::Average && options_.divide_by_set_size()) {
    // The same mean without joined ranks; with them, over the whole set.
    op = ReduceOp::Sum;
    post /= options_.process_set().size();
  }
  return {op, 1.0 / f, post};
}

void GradientEngine::launch(size_t bi) {
  if (sharded_) {
    launch_sharded(bi);
    return;
  }
  const LayoutBucket& b = layout_.buckets[bi];
  BucketState& state = bucket_state_[bi];
  torch::NoGradGuard no_grad;
  Span span("ronde::launch");
  pack(bi);
  write_used_mask(bi);
  const ReduceFactors r = reduce_factors();
  profile_.hooks_before_launch.push_back(hooks_);
  profile_.hooks = hooks_;
  state.handle = launch_hooked(
      bi,
      AllreduceOptions()
          .op(r.op)
          .prescale_factor(r.pre)
          .postscale_factor(r.post)
          .name(b.name)
          .process_set(options_.process_set())
          // Bucket layouts were checked on the first step; later steps
          // skip the descriptor exchange but for the first bucket, whose
          // check tells a rank in ronde::join() that a step began (and
          // makes the others check the rest of it while one is).
          .verify(!verified_ || bi == 0));
  state.launched = true;
}

void GradientEngine::check_passes() const {
  const int64_t k = options_.backward_passes_per_step();
  for (size_t slot = 0; slot < slot_state_.size(); ++slot) {
    const int64_t passes = slot_state_[slot].passes;
    TORCH_CHECK(
        passes == 0 || passes == k,
        "ronde: step() after ",
        passes,
        " backward passes on rank ",
        ronde::rank(),
        " (parameter '",
        names_[layout_.slots[slot].index],
        "'), but backward_passes_per_step is ",
        k,
        ": call step() after every ",
        k,
        " backward passes");
  }
}

// A parameter replaced in place after the hooks were installed (Tensor::set_,
// which is how torch::load fills a Module) no longer points at the
// accumulator we hooked (the one its last backward used is gone with the
// graph), so its gradient arrived unannounced: take it now (its bucket
// cannot have launched without it), and hook a new accumulator, which later
// graphs will use, for the next steps.
void GradientEngine::adopt_replaced_parameters() {
  const int64_t k = options_.backward_passes_per_step();
  for (size_t slot = 0; slot < layout_.slots.size(); ++slot) {
    const LayoutSlot& s = layout_.slots[slot];
    SlotState& state = slot_state_[slot];
    auto current = torch::autograd::impl::try_get_grad_accumulator(s.param);
    if (current == state.accumulator)
      continue;
    if (!current)
      current = torch::autograd::impl::grad_accumulator(s.param);
    hook(slot, std::move(current));
    BucketState& bucket = bucket_state_[s.bucket];
    if (state.passes == 0 && s.param.grad().defined() && !bucket.launched) {
      state.passes = k;
      --bucket.pending;
    }
  }
}

void GradientEngine::wait_all() {
  auto t0 = std::chrono::steady_clock::now();
  Span span("ronde::wait");
  for (size_t bi = 0; bi < layout_.buckets.size(); ++bi) {
    bucket_state_[bi].handle.wait();
  }
  profile_.wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  span.timeline("wait for all-reduces", "wait");
}

// Points (or, without bucket views, copies) every .grad at its averaged
// segment. Buckets copied out whole take one split each; the other copies
// are batched together.
void GradientEngine::unpack() {
  torch::NoGradGuard no_grad;
  Span span("ronde::unpack");
  std::vector<at::Tensor> dst, src, bucket_dst, bucket_src;
  bool unpacked = false;
  for (const LayoutBucket& b : layout_.buckets) {
    bucket_dst.clear();
    bucket_src.clear();
    // Whether a parameter was used on any rank is in the bucket's mask;
    // reading it costs a device sync, so only a bucket with a parameter
    // unused here reads it (used here means used).
    bool all_used_here = true;
    for (size_t slot : b.slots)
      all_used_here = all_used_here && used_here(slot);
    at::Tensor used;
    if (!all_used_here)
      used = b.mask.to(at::kCPU, at::kFloat);
    for (size_t pos = 0; pos < b.slots.size(); ++pos) {
      const LayoutSlot& s = layout_.slots[b.slots[pos]];
      // Unused on every rank: leave .grad as zero_grad() left it, as one
      // process would.
      if (used.defined() && !(used.data_ptr<float>()[pos] > 0))
        continue;
      at::Tensor& grad = s.param.mutable_grad();
      if (options_.gradient_as_bucket_view()) {
        if (!grad.defined() || !grad.is_same(s.view))
          grad = s.view;
      } else if (grad.defined() && !grad.is_sparse()) {
        bucket_dst.push_back(grad);
        bucket_src.push_back(s.view);
      } else {
        grad = s.view.clone();
      }
    }
    unpacked = unpacked || !bucket_dst.empty();
    if (!prefers_whole(b.flat, bucket_copy_whole_) ||
        !unpack_whole(b.flat, bucket_src, bucket_dst)) {
      dst.insert(dst.end(), bucket_dst.begin(), bucket_dst.end());
      src.insert(src.end(), bucket_src.begin(), bucket_src.end());
    }
  }
  if (!dst.empty())
    batched_copy(dst, src);
  if (unpacked)
    span.timeline("unpack", "unpack");
}

void GradientEngine::synchronize() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (synchronized_)
    return;
  check_passes();
  adopt_replaced_parameters();
  // Buckets holding parameters that got no gradient here launch now, in
  // order, so every rank still runs every bucket.
  while (next_launch_ < layout_.buckets.size())
    launch(next_launch_++);
  if (sharded_) {
    wait_all_sharded();
    unpack_sharded();
  } else {
    wait_all();
    unpack();
  }
  synchronized_ = true;
  verified_ = true;
}

bool GradientEngine::synchronized() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return synchronized_;
}

void GradientEngine::reset_buckets_locked() {
  for (size_t bi = 0; bi < layout_.buckets.size(); ++bi) {
    BucketState& b = bucket_state_[bi];
    b.pending = layout_.buckets[bi].slots.size();
    b.launched = false;
    b.handle = Handle();
  }
}

void GradientEngine::reset_locked() {
  for (auto& s : slot_state_)
    s.passes = 0;
  hook_states_.clear();
  reset_buckets_locked();
  next_launch_ = 0;
  synchronized_ = false;
  last_profile_ = profile_;
  profile_ = StepProfile();
  hooks_ = 0;
}

void GradientEngine::finish_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (synchronized_)
    after_step_locked();
  reset_locked();
}

void GradientEngine::skip_step() {
  synchronize();
  finish_step();
}

at::Tensor GradientEngine::step(
    const std::function<at::Tensor(GradientReducer::Closure)>& update,
    GradientReducer::Closure closure,
    bool synchronize_first) {
  if (!closure) {
    if (synchronize_first) {
      synchronize();
    } else {
      TORCH_CHECK(
          synchronized(),
          "ronde: step() inside skip_synchronize() before synchronize(): "
          "the gradients are not averaged yet");
    }
    at::Tensor out;
    {
      Span span("ronde::step");
      out = update(nullptr);
      span.timeline("optimizer step", "step");
    }
    if (sharded_)
      gather_parameters();
    finish_step();
    return out;
  }
  TORCH_CHECK(
      options_.backward_passes_per_step() == 1,
      "ronde: step(closure) evaluates the closure itself; use "
      "backward_passes_per_step = 1 with it");
  // Each evaluation is one synchronised backward pass, and its loss the
  // mean over ranks: line searches then decide alike on every rank.
  auto synced = [this, &closure]() -> at::Tensor {
    finish_step();
    at::Tensor loss = closure();
    synchronize();
    if (!loss.defined())
      return loss;
    return ronde::allreduce(
        loss.detach(),
        AllreduceOptions()
            .name("ronde.closure_loss")
            .process_set(options_.process_set()));
  };
  at::Tensor out;
  {
    Span span("ronde::step");
    out = update(synced);
    span.timeline("optimizer step", "step");
  }
  if (sharded_)
    gather_parameters();
  finish_step();
  return out;
}

std::vector<std::vector<std::string>> GradientEngine::bucket_names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<std::string>> out;
  for (const auto& b : layout_.buckets) {
    out.emplace_back();
    for (size_t s : b.slots)
      out.back().push_back(names_[layout_.slots[s].index]);
  }
  return out;
}

std::vector<at::Tensor> GradientEngine::gradient_buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<at::Tensor> out;
  if (sharded_) {
    for (const auto& t : shards_) {
      if (t.grad().defined())
        out.push_back(t.grad());
    }
  } else if (options_.gradient_as_bucket_view()) {
    for (const auto& b : layout_.buckets)
      out.push_back(b.buffer);
  } else {
    for (const auto& s : layout_.slots) {
      if (s.param.grad().defined())
        out.push_back(s.param.grad());
    }
  }
  return out;
}

StepProfile GradientEngine::last_profile() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_profile_;
}

}  // namespace ronde::detail
