// The gradient engine's sharded path (ZeRO stages 1 and 2; sharding.h): a
// bucket is reduce-scattered instead of all-reduced, the optimizer steps on
// views of this rank's pieces of the parameters, and after the update an
// all-gather per bucket brings every rank's range back into the
// parameters. Member functions of GradientEngine, under its mutex_ like
// the rest (docs/sharding.md).
#include "engine/gradient_engine.h"

#include "comm/collective_calls.h"

#include "engine/pack.h"
#include "runtime/span.h"

#include <ronde/runtime.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace ronde::detail {
void GradientEngine::make_shards_locked() {
  const ProcessSet& set = options_.process_set();
  pieces_ = detail::shard_pieces(layout_, set.rank(), set.size());
  shards_.clear();
  torch::NoGradGuard no_grad;
  for (const ShardPiece& p : pieces_) {
    const at::Tensor& param = layout_.slots[p.slot].param;
    TORCH_CHECK(
        param.is_contiguous(),
        "ronde: sharding needs contiguous parameters; '",
        names_[p.param],
        "' is not (rank ",
        ronde::rank(),
        ")");
    at::Tensor shard =
        param.detach().view({-1}).narrow(0, p.param_offset, p.numel);
    shard.requires_grad_(true);
    shards_.push_back(std::move(shard));
  }
  launched_used_.assign(layout_.slots.size(), 0.0f);
  had_grad_.assign(layout_.slots.size(), 0);
  // New buckets (a relayout, a new world): staging made for the old ones
  // goes.
  staging_.clear();
  gather_verified_ = false;
  shards_changed_ = true;
}

std::vector<ShardPiece> GradientEngine::shard_pieces() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pieces_;
}

std::vector<at::Tensor> GradientEngine::shard_tensors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shards_;
}

bool GradientEngine::take_shards_changed() {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool changed = shards_changed_;
  shards_changed_ = false;
  return changed;
}

std::vector<at::Tensor> GradientEngine::parameters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<at::Tensor> params(layout_.slots.size());
  for (const LayoutSlot& s : layout_.slots)
    params[s.index] = s.param;
  return params;
}

// Stage 1 packs into the bucket's own buffer; stage 2 into a buffer that
// lives until the reduce-scatter is done, and lets each .grad go. On the
// host that buffer, the 16-bit wire (at either stage) and the output are
// kept between steps (take_staging_locked, owned_into_locked).
void GradientEngine::launch_sharded(size_t bi) {
  const LayoutBucket& b = layout_.buckets[bi];
  BucketState& state = bucket_state_[bi];
  torch::NoGradGuard no_grad;
  Span span("ronde::launch");
  for (size_t slot : b.slots) {
    launched_used_[slot] = used_here(slot) ? 1.0f : 0.0f;
    had_grad_[slot] = layout_.slots[slot].param.grad().defined();
  }
  const at::Tensor& first = layout_.slots[b.slots.front()].param;
  const auto opts = first.options().requires_grad(false);
  const bool host = first.device().is_cpu();
  std::optional<size_t> packed;  // the staging buffer `flat` lies in
  at::Tensor flat;
  if (shard_gradients_) {
    if (host) {
      packed = take_staging_locked(b.numel, opts);
      flat = staging_[*packed].buffer.narrow(0, 0, b.numel);
    } else {
      flat = at::zeros({b.numel}, opts);
    }
    // A kept buffer holds an earlier bucket, a new one anything: zeros
    // wherever no gradient is copied (padding, parameters unused here).
    std::vector<at::Tensor> dst, src;
    int64_t end = 0;
    for (size_t slot : b.slots) {
      const LayoutSlot& s = layout_.slots[slot];
      if (!used_here(slot))
        continue;
      if (packed && s.offset > end)
        flat.narrow(0, end, s.offset - end).zero_();
      dst.push_back(segment_view(flat, s.offset, s.param.sizes()));
      src.push_back(s.param.grad());
      end = s.offset + s.param.numel();
    }
    if (packed && end < b.numel)
      flat.narrow(0, end, b.numel - end).zero_();
    if (!dst.empty())
      batched_copy(dst, src);
    for (size_t slot : b.slots)
      layout_.slots[slot].param.mutable_grad() = at::Tensor();
  } else {
    pack(bi);
    flat = b.flat;
  }
  const ReduceFactors r = reduce_factors();
  profile_.hooks_before_launch.push_back(hooks_);
  profile_.hooks = hooks_;
  state.wire = at::Tensor();
  at::Tensor target = flat;
  std::optional<size_t> sent = packed;  // the staging buffer the call reads
  if (compressible(flat, options_.compression())) {
    const auto wire_opts = opts.dtype(wire_dtype(options_.compression()));
    if (host) {
      sent = take_staging_locked(b.numel, wire_opts);
      state.wire = staging_[*sent].buffer.narrow(0, 0, b.numel).copy_(flat);
      if (packed)
        staging_[*packed].held = false;  // read: free at once
    } else {
      state.wire = flat.to(wire_opts.dtype());
    }
    target = state.wire;
  }
  state.handle = reducescatter_call(
      target.view({b.numel / kShardAlign, kShardAlign}),
      ReducescatterOptions()
          .op(r.op)
          .prescale_factor(r.pre)
          .postscale_factor(r.post)
          .name(b.name)
          .process_set(options_.process_set())
          .verify(!verified_ || bi == 0),
      /*blocking=*/false,
      owned_into_locked(bi, target));
  if (sent) {
    staging_[*sent].reader = state.handle;
    staging_[*sent].held = false;
  }
  state.launched = true;
}

size_t GradientEngine::take_staging_locked(
    int64_t numel, const at::TensorOptions& options) {
  size_t best = staging_.size();
  for (size_t i = 0; i < staging_.size(); ++i) {
    const Staging& s = staging_[i];
    const bool reading = s.reader.state() && !s.reader.done();
    if (s.held || reading || s.buffer.dtype() != options.dtype() ||
        s.buffer.numel() < numel)
      continue;
    if (best == staging_.size() ||
        s.buffer.numel() < staging_[best].buffer.numel())
      best = i;
  }
  // Private memory: in the arena, where the reduce-scatter would read it
  // in place, the step was no faster and peak RSS higher
  // (benchmarks/README.md, "Kept buffers for the sharded step"). Whatever
  // it holds, the packing overwrites or zeroes.
  if (best == staging_.size())
    staging_.push_back(Staging{at::empty({numel}, options), Handle()});
  Staging& s = staging_[best];
  s.reader = Handle();
  s.held = true;
  s.used = true;
  return best;
}

at::Tensor GradientEngine::owned_into_locked(
    size_t bi, const at::Tensor& target) {
  const LayoutBucket& b = layout_.buckets[bi];
  const ProcessSet& set = options_.process_set();
  const auto [lo, hi] = owned_range(b.numel, set.rank(), set.size());
  const at::Tensor& first = layout_.slots[b.slots.front()].param;
  if (!first.device().is_cpu())
    return at::Tensor();
  auto keep = [&](at::Tensor& kept, const at::TensorOptions& options) {
    if (!kept.defined() || kept.numel() != hi - lo ||
        kept.scalar_type() != options.dtype())
      kept = at::empty({hi - lo}, options);
    return kept;
  };
  BucketState& state = bucket_state_[bi];
  const auto opts = first.options().requires_grad(false);
  keep(state.kept_owned, opts);
  // A 16-bit wire's output has a kept buffer of its own, converted into
  // kept_owned once waited.
  if (target.scalar_type() != first.scalar_type())
    return keep(state.kept_wire_owned, opts.dtype(target.scalar_type()));
  state.kept_wire_owned = at::Tensor();
  return state.kept_owned;
}

// Whether each parameter was used on some rank, for the pieces this rank
// steps: one small all-reduce of every slot's flag, after the buckets.
void GradientEngine::wait_all_sharded() {
  auto t0 = std::chrono::steady_clock::now();
  Span span("ronde::wait");
  used_ = at::tensor(launched_used_, at::kFloat);
  used_handle_ = allreduce_async_(
      used_,
      AllreduceOptions()
          .op(ReduceOp::Sum)
          .name("ronde.shard.used")
          .process_set(options_.process_set())
          .verify(!verified_));
  for (size_t bi = 0; bi < layout_.buckets.size(); ++bi) {
    BucketState& state = bucket_state_[bi];
    at::Tensor owned = state.handle.result().view({-1});
    if (state.wire.defined()) {
      const at::Tensor& first =
          layout_.slots[layout_.buckets[bi].slots.front()].param;
      owned = state.kept_owned.defined() ? state.kept_owned.copy_(owned)
                                         : owned.to(first.scalar_type());
      state.wire = at::Tensor();
    }
    state.owned = owned;
  }
  used_handle_.wait();
  // Every reduce-scatter is done: a staging buffer this step did not take
  // goes (the buckets changed, or fewer were in flight at once).
  staging_.erase(
      std::remove_if(
          staging_.begin(),
          staging_.end(),
          [](const Staging& s) { return !s.used; }),
      staging_.end());
  for (Staging& s : staging_) {
    s.used = false;
    s.held = false;  // a launch that threw left it held
    s.reader = Handle();
  }
  profile_.wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  span.timeline("wait for reduce-scatters", "wait");
}

// Each shard's .grad becomes its range of the averaged bucket; a parameter
// unused on every rank keeps what zero_grad() left (none, or zeros), as
// one process would.
void GradientEngine::unpack_sharded() {
  const ProcessSet& set = options_.process_set();
  const float* used = used_.data_ptr<float>();
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const ShardPiece& p = pieces_[k];
    const int64_t lo =
        owned_range(layout_.buckets[p.bucket].numel, set.rank(), set.size())
            .first;
    at::Tensor& grad = shards_[k].mutable_grad();
    if (used[p.slot] > 0 || had_grad_[p.slot]) {
      // An alias, not a view: LibTorch's zero_grad() detaches in place.
      grad = segment_view(
          bucket_state_[p.bucket].owned, p.bucket_offset - lo, {p.numel});
    } else {
      grad = at::Tensor();
    }
  }
}

void GradientEngine::gather_parameters() {
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  Span span("ronde::gather");
  const ProcessSet& set = options_.process_set();
  std::vector<Handle> handles(layout_.buckets.size());
  auto finish = [&](size_t bi) {
    const LayoutBucket& b = layout_.buckets[bi];
    at::Tensor all = handles[bi].result().view({-1});
    TORCH_CHECK(
        all.numel() == b.numel,
        "ronde: the all-gather of ",
        b.name,
        " brought ",
        all.numel(),
        " elements to rank ",
        ronde::rank(),
        ", expected ",
        b.numel,
        ": a sharded optimizer needs every rank to step (is one in "
        "ronde::join()?)");
    std::vector<at::Tensor> dst, src;
    for (size_t slot : b.slots) {
      const LayoutSlot& s = layout_.slots[slot];
      at::Tensor from = segment_view(all, s.offset, s.param.sizes());
      if (from.data_ptr() == s.param.data_ptr())
        continue;  // gathered straight into the parameter
      dst.push_back(s.param.detach());
      src.push_back(std::move(from));
    }
    if (!dst.empty())
      batched_copy(dst, src);
  };
  size_t k = 0;
  for (size_t bi = 0; bi < layout_.buckets.size(); ++bi) {
    const LayoutBucket& b = layout_.buckets[bi];
    const auto [lo, hi] = owned_range(b.numel, set.rank(), set.size());
    const at::Tensor& first = layout_.slots[b.slots.front()].param;
    const auto opts = first.options().requires_grad(false);
    at::Tensor mine, out;
    const bool direct = b.slots.size() == 1 && first.numel() == b.numel &&
                        first.is_contiguous();
    if (direct) {
      // A bucket that is one parameter, unpadded (a large one has a bucket
      // of its own): the parameter is the gather's output, and this rank's
      // range of it, which the update wrote, its input (its own block,
      // which the backends leave where it is). No copy in or out.
      out = first.detach().view({-1});
      mine = out.narrow(0, lo, hi - lo);
      while (k < pieces_.size() && pieces_[k].bucket == bi)
        ++k;
    } else {
      // This rank's range: the reduce-scatter's output, whose gradients
      // the update has consumed, else a new one.
      mine = bucket_state_[bi].owned;
      if (!mine.defined() || mine.numel() != hi - lo ||
          mine.scalar_type() != first.scalar_type())
        mine = at::zeros({hi - lo}, opts);
      for (; k < pieces_.size() && pieces_[k].bucket == bi; ++k) {
        mine.narrow(0, pieces_[k].bucket_offset - lo, pieces_[k].numel)
            .copy_(shards_[k].detach());
      }
      // Two gather buffers, kept between steps, serve every other bucket
      // in turn: only the buckets in flight hold full-size memory, and no
      // fresh pages are faulted in each step.
      at::Tensor& pool = gather_pool_[bi % 2];
      if (!pool.defined() || pool.numel() < b.numel ||
          pool.scalar_type() != first.scalar_type() ||
          pool.device() != first.device())
        pool = at::empty({b.numel}, opts);
      out = pool;
    }
    handles[bi] = allgather_call(
        mine.view({(hi - lo) / kShardAlign, kShardAlign}),
        CollectiveOptions()
            .name(b.name + " gather")
            .process_set(set)
            .verify(!gather_verified_ || bi == 0),
        /*blocking=*/false,
        out,
        /*whole=*/direct);
    // One bucket in flight while the last one is copied out: at most two
    // gathered buckets exist at once.
    if (bi > 0)
      finish(bi - 1);
  }
  if (!layout_.buckets.empty())
    finish(layout_.buckets.size() - 1);
  gather_verified_ = true;
  for (auto& state : bucket_state_)
    state.owned = at::Tensor();
  for (auto& shard : shards_)
    shard.mutable_grad() = at::Tensor();
  span.timeline("gather parameters", "step");
}

double GradientEngine::gradient_norm(double norm_type) {
  synchronize();
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  const ProcessSet& set = options_.process_set();
  const bool inf = std::isinf(norm_type);
  // The pieces an aligned layout would give this rank, over the averaged
  // gradient this rank holds: its shards', or the full .grad's segments.
  std::vector<ShardPiece> pieces =
      sharded_ ? pieces_
               : detail::shard_pieces(layout_, set.rank(), set.size(), false);
  std::vector<at::Tensor> parts;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const ShardPiece& p = pieces[k];
    at::Tensor g =
        sharded_ ? shards_[k].grad() : layout_.slots[p.slot].param.grad();
    if (!g.defined())
      continue;
    if (!sharded_)
      g = g.reshape({-1}).narrow(0, p.param_offset, p.numel);
    at::Tensor a = g.detach().to(at::kDouble).abs();
    parts.push_back(inf ? a.max() : a.pow(norm_type).sum());
  }
  at::Tensor local =
      parts.empty() ? at::zeros({1}, at::kDouble)
                    : (inf ? at::stack(parts).max() : at::stack(parts).sum())
                          .reshape({1});
  if (set.size() > 1) {
    allreduce_(
        local,
        AllreduceOptions()
            .op(inf ? ReduceOp::Max : ReduceOp::Sum)
            .name("ronde.clip.norm")
            .process_set(set));
  }
  const double total = local.item<double>();
  return inf ? total : std::pow(total, 1.0 / norm_type);
}

}  // namespace ronde::detail
