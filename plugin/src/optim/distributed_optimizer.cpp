// DistributedOptimizer and its gradient engine. A post-hook on each
// parameter's gradient accumulator marks the parameter ready during
// backward; a bucket whose parameters are all ready is all-reduced at once,
// asynchronously, provided every earlier bucket has been launched (so every
// rank launches the same buckets in the same order whatever order the hooks
// fire in). step() launches what is left, waits, and steps the wrapped
// optimizer on the averaged gradients.
#include <ronde/optimizer.h>
#include <ronde/timeline.h>

#include "optim/batched_copy.h"
#include "optim/bucket_assignment.h"
#include "runtime/error_text.h"
#include "runtime/launch_env.h"

#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/serialize.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_set>
#include <utility>

namespace ronde {
namespace detail {
namespace {

// How the autograd graph holds a node: std::shared_ptr up to LibTorch 2.12,
// c10::intrusive_ptr from 2.13. Taken from the API, so both build.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(
    std::declval<const at::Tensor&>()));

// Param-group options that forward the learning rate to the wrapped
// optimizer's group, looked up on every call: LibTorch's LR schedulers act
// on whichever object they are given and both see one value. (Looked up by
// index, since the wrapped optimizer's load() replaces its options objects.)
class ForwardingOptions : public torch::optim::OptimizerOptions {
 public:
  // group < 0 forwards to the wrapped optimizer's defaults.
  ForwardingOptions(torch::optim::Optimizer* target, int group)
      : target_(target), group_(group) {}
  std::unique_ptr<OptimizerOptions> clone() const override {
    return std::make_unique<ForwardingOptions>(target_, group_);
  }
  double get_lr() const override {
    return resolve().get_lr();
  }
  void set_lr(const double lr) override {
    resolve().set_lr(lr);
  }

 private:
  torch::optim::OptimizerOptions& resolve() const {
    if (group_ < 0)
      return target_->defaults();
    TORCH_CHECK(
        static_cast<size_t>(group_) < target_->param_groups().size(),
        "ronde: the wrapped optimizer lost param group ",
        group_);
    return target_->param_groups()[group_].options();
  }
  torch::optim::Optimizer* target_;  // owned by the DistributedOptimizer
  int group_;
};

std::vector<torch::optim::OptimizerParamGroup> forwarding_groups(
    torch::optim::Optimizer& wrapped) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t g = 0; g < wrapped.param_groups().size(); ++g) {
    groups.emplace_back(
        wrapped.param_groups()[g].params(),
        std::make_unique<ForwardingOptions>(&wrapped, static_cast<int>(g)));
  }
  return groups;
}

// Tensors that may share one flat buffer: same dtype, same device.
std::string dtype_device_key(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << "@" << t.device();
  return os.str();
}

std::string describe_tensor(const std::string& name, const at::Tensor& t) {
  std::ostringstream os;
  os << "'" << name << "' " << t.scalar_type() << t.sizes() << " on "
     << t.device();
  return os.str();
}

// Every rank's list of tensors must match rank 0's; otherwise every rank
// raises the same error naming the first difference.
void check_same_everywhere(
    const std::string& what, const std::vector<std::string>& lines) {
  if (ronde::size() == 1)
    return;
  std::string joined;
  for (const auto& l : lines)
    joined += l + "\n";
  at::Tensor mine = at::empty({static_cast<int64_t>(joined.size())}, at::kByte);
  if (!joined.empty())  // no data pointer when empty
    std::memcpy(mine.data_ptr(), joined.data(), joined.size());
  // Lengths first (one row each), so the texts can be split apart.
  at::Tensor lengths = ronde::allgather(
      at::full({1}, static_cast<int64_t>(joined.size()), at::kLong),
      CollectiveOptions().name(what + ".check"));
  at::Tensor all =
      ronde::allgather(mine, CollectiveOptions().name(what + ".check"));
  std::vector<std::vector<std::string>> per_rank;
  int64_t offset = 0;
  for (int r = 0; r < ronde::size(); ++r) {
    int64_t len = lengths[r].item<int64_t>();
    std::string text(static_cast<const char*>(all.data_ptr()) + offset, len);
    offset += len;
    std::vector<std::string> rows;
    std::istringstream is(text);
    for (std::string row; std::getline(is, row);)
      rows.push_back(row);
    per_rank.push_back(std::move(rows));
  }
  for (int r = 1; r < ronde::size(); ++r) {
    const auto& a = per_rank[0];
    const auto& b = per_rank[r];
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      std::string x = i < a.size() ? a[i] : "nothing";
      std::string y = i < b.size() ? b[i] : "nothing";
      TORCH_CHECK(
          x == y,
          "ronde: ",
          what,
          ": ranks disagree (seen on rank ",
          ronde::rank(),
          "): at position ",
          i,
          " rank 0 has ",
          x,
          " but rank ",
          r,
          " has ",
          y,
          " (rank 0 has ",
          a.size(),
          ", rank ",
          r,
          " has ",
          b.size(),
          " in all)");
    }
  }
}

std::vector<int64_t> dense_strides(at::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

// Base LRs of every optimizer a DistributedOptimizer scaled, so wrapping it
// again starts from the base, not from the already scaled LR.
struct BaseLrRegistry {
  std::mutex mutex;
  std::map<
      const torch::optim::Optimizer*,
      std::pair<std::weak_ptr<torch::optim::Optimizer>, std::vector<double>>>
      entries;
};

BaseLrRegistry& base_lr_registry() {
  static BaseLrRegistry registry;
  return registry;
}

std::vector<double> remember_base_lrs(
    const std::shared_ptr<torch::optim::Optimizer>& opt) {
  auto& reg = base_lr_registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.entries.find(opt.get());
  // A dead optimizer's address may be reused: only a live match counts.
  if (it != reg.entries.end() && it->second.first.lock() == opt &&
      it->second.second.size() == opt->param_groups().size()) {
    return it->second.second;
  }
  std::vector<double> lrs;
  for (auto& g : opt->param_groups())
    lrs.push_back(g.options().get_lr());
  reg.entries[opt.get()] = {opt, lrs};
  return lrs;
}

void set_base_lrs(
    const std::shared_ptr<torch::optim::Optimizer>& opt,
    const std::vector<double>& lrs) {
  auto& reg = base_lr_registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.entries[opt.get()] = {opt, lrs};
}

at::ScalarType wire_dtype(Compression c) {
  return c == Compression::FP16 ? at::kHalf : at::kBFloat16;
}

double resolve_fusion_mb(double option) {
  if (option > 0)
    return option;
  TORCH_CHECK(
      option == 0, "ronde: fusion_threshold_mb must be positive, got ", option);
  if (auto bytes = positive_env_number("RONDE_FUSION_THRESHOLD", "bytes")) {
    return *bytes / (1 << 20);
  }
  return kDefaultFusionThresholdMb;
}

}  // namespace

class GradientEngine : public std::enable_shared_from_this<GradientEngine> {
 public:
  GradientEngine(
      std::vector<std::string> names,
      std::vector<at::Tensor> params,
      const DistributedOptimizerOptions& o)
      : options_(o), names_(std::move(names)) {
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
        "ronde: first_bucket_mb must be "
        "positive, got ",
        o.first_bucket_mb());
    const double mb = resolve_fusion_mb(o.fusion_threshold_mb());
    bucket_copy_setting();  // a bad RONDE_BUCKET_COPY fails here
    // Ready order: gradients arrive roughly in reverse registration order.
    std::vector<size_t> bytes;
    std::vector<std::string> keys;
    for (size_t i = params.size(); i-- > 0;) {
      Slot slot;
      slot.param = params[i];
      slot.index = i;
      slots_.push_back(std::move(slot));
      bytes.push_back(params[i].numel() * params[i].element_size());
      keys.push_back(dtype_device_key(params[i]));
    }
    auto assignment = assign_buckets(
        bytes,
        keys,
        static_cast<size_t>(o.first_bucket_mb() * (1 << 20)),
        static_cast<size_t>(mb * (1 << 20)));
    for (auto& members : assignment) {
      Bucket b;
      int64_t numel = 0;
      for (size_t s : members)
        numel += slots_[s].param.numel();
      const at::Tensor& first = slots_[members.front()].param;
      // One trailing element per parameter flags whether any rank produced
      // its gradient: the same all-reduce tells who used it.
      b.buffer = at::zeros(
          {numel + static_cast<int64_t>(members.size())},
          first.options().requires_grad(false));
      b.flat = b.buffer.narrow(0, 0, numel);
      b.mask = b.buffer.narrow(0, numel, members.size());
      int64_t offset = 0;
      for (size_t pos = 0; pos < members.size(); ++pos) {
        Slot& s = slots_[members[pos]];
        s.bucket = buckets_.size();
        s.pos = pos;
        // An alias of the bucket's storage rather than an autograd view:
        // LibTorch's zero_grad() calls detach_(), which views refuse.
        s.view = at::empty({0}, b.buffer.options())
                     .set_(
                         b.buffer.storage(),
                         b.buffer.storage_offset() + offset,
                         s.param.sizes(),
                         dense_strides(s.param.sizes()));
        offset += s.param.numel();
      }
      b.slots = members;
      std::string list;
      for (size_t pos = 0; pos < members.size() && pos < 3; ++pos) {
        list += (pos ? ", " : "") + names_[slots_[members[pos]].index];
      }
      if (members.size() > 3)
        list += ", +" + std::to_string(members.size() - 3) + " more";
      b.name =
          "ronde.bucket." + std::to_string(buckets_.size()) + " [" + list + "]";
      buckets_.push_back(std::move(b));
    }
    reset();
  }

  // Hooks hold a weak pointer: an engine destroyed first leaves them inert,
  // and the destructor removes them anyway.
  void install_hooks() {
    for (size_t i = 0; i < slots_.size(); ++i) {
      auto accumulator =
          torch::autograd::impl::grad_accumulator(slots_[i].param);
      TORCH_CHECK(
          accumulator,
          "ronde: no gradient accumulator for '",
          names_[slots_[i].index],
          "' (is it a leaf that requires grad?)");
      hook(i, std::move(accumulator));
    }
  }

  void hook(size_t i, NodePtr accumulator) {
    Slot& s = slots_[i];
    if (s.accumulator)
      s.accumulator->del_post_hook(s.hook_key);
    std::weak_ptr<GradientEngine> weak = shared_from_this();
    s.accumulator = std::move(accumulator);
    s.hook_key = s.accumulator->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [weak, i](
                const torch::autograd::variable_list& outputs,
                const torch::autograd::variable_list&) {
              if (auto engine = weak.lock())
                engine->on_ready(i);
              return outputs;
            }));
  }

  ~GradientEngine() {
    for (auto& s : slots_) {
      if (s.accumulator)
        s.accumulator->del_post_hook(s.hook_key);
    }
    // Let in-flight all-reduces finish before their buffers go away.
    for (auto& b : buckets_) {
      if (b.launched) {
        try {
          b.handle.wait();
        } catch (...) {
        }
      }
    }
  }

  void on_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& s = slots_[i];
    ++hooks_;
    TORCH_CHECK(
        !synchronized_,
        "ronde: a gradient of '",
        names_[s.index],
        "' arrived after synchronize() and before step() on rank ",
        ronde::rank(),
        "; it would be lost");
    ++s.passes;
    const int64_t k = options_.backward_passes_per_step();
    TORCH_CHECK(
        s.passes <= k,
        "ronde: '",
        names_[s.index],
        "' received ",
        s.passes,
        " backward passes without step() on rank ",
        ronde::rank(),
        ", but backward_passes_per_step is ",
        k);
    if (timeline_enabled()) {
      timeline_instant(
          "gradient " + names_[s.index],
          "hook",
          "\"pass\":" + std::to_string(s.passes));
    }
    if (s.passes < k)
      return;  // accumulate locally
    Bucket& b = buckets_[s.bucket];
    if (--b.pending == 0)
      launch_ready();
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (synchronized_)
      return;
    const int64_t k = options_.backward_passes_per_step();
    for (auto& s : slots_) {
      TORCH_CHECK(
          s.passes == 0 || s.passes == k,
          "ronde: step() after ",
          s.passes,
          " backward passes on rank ",
          ronde::rank(),
          " (parameter '",
          names_[s.index],
          "'), but backward_passes_per_step is ",
          k,
          ": call step() after every ",
          k,
          " backward passes");
    }
    // A parameter replaced in place after the hooks were installed
    // (Tensor::set_, which is how torch::load fills a Module) no longer
    // points at the accumulator we hooked (the one its last backward used
    // is gone with the graph), so its gradient arrived unannounced: take it
    // now (its bucket cannot have launched without it), and hook a new
    // accumulator, which later graphs will use, for the next steps.
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      auto current = torch::autograd::impl::try_get_grad_accumulator(s.param);
      if (current == s.accumulator)
        continue;
      if (!current)
        current = torch::autograd::impl::grad_accumulator(s.param);
      hook(i, std::move(current));
      if (s.passes == 0 && s.param.grad().defined() &&
          !buckets_[s.bucket].launched) {
        s.passes = k;
        --buckets_[s.bucket].pending;
      }
    }
    // Buckets holding parameters that got no gradient here launch now, in
    // order, so every rank still runs every bucket.
    while (next_launch_ < buckets_.size())
      launch(next_launch_++);
    auto t0 = std::chrono::steady_clock::now();
    const int64_t wait_us = timeline_enabled() ? timeline_now_us() : -1;
    for (auto& b : buckets_) {
      b.handle.wait();
      if (b.wire.defined())
        b.buffer.copy_(b.wire);
    }
    profile_.wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (wait_us >= 0) {
      timeline_span("wait for all-reduces", "wait", wait_us, timeline_now_us());
    }
    torch::NoGradGuard no_grad;
    const int64_t unpack_us = timeline_enabled() ? timeline_now_us() : -1;
    // Buckets copied out whole take one split each; the other copies are
    // batched together.
    std::vector<at::Tensor> dst, src, bucket_dst, bucket_src;
    bool unpacked = false;
    for (auto& b : buckets_) {
      bucket_dst.clear();
      bucket_src.clear();
      // Whether a parameter was used on any rank is in the bucket's mask;
      // reading it costs a device sync, so only a bucket with a parameter
      // unused here reads it (used here means used).
      bool all_used_here = true;
      for (size_t slot : b.slots)
        all_used_here = all_used_here && used_here(slots_[slot]);
      at::Tensor used;
      if (!all_used_here)
        used = b.mask.to(at::kCPU, at::kFloat);
      for (size_t pos = 0; pos < b.slots.size(); ++pos) {
        Slot& s = slots_[b.slots[pos]];
        // Unused on every rank: leave .grad as zero_grad() left it, as one
        // process would.
        if (used.defined() && !(used.data_ptr<float>()[pos] > 0))
          continue;
        at::Tensor& grad = s.param.mutable_grad();
        if (options_.gradient_as_bucket_view()) {
          if (!grad.defined() || !grad.is_same(s.view))
            grad = s.view;
        } else if (grad.defined()) {
          bucket_dst.push_back(grad);
          bucket_src.push_back(s.view);
        } else {
          grad = s.view.clone();
        }
      }
      unpacked = unpacked || !bucket_dst.empty();
      if (!prefers_whole(b.flat) ||
          !unpack_whole(b.flat, bucket_src, bucket_dst)) {
        dst.insert(dst.end(), bucket_dst.begin(), bucket_dst.end());
        src.insert(src.end(), bucket_src.begin(), bucket_src.end());
      }
    }
    if (!dst.empty())
      batched_copy(dst, src);
    if (unpack_us >= 0 && unpacked) {
      timeline_span("unpack", "unpack", unpack_us, timeline_now_us());
    }
    synchronized_ = true;
    verified_ = true;
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : slots_)
      s.passes = 0;
    for (auto& b : buckets_) {
      b.pending = b.slots.size();
      b.launched = false;
      b.handle = Handle();
    }
    next_launch_ = 0;
    synchronized_ = false;
    last_profile_ = profile_;
    profile_ = StepProfile();
    hooks_ = 0;
  }

  std::vector<std::vector<std::string>> bucket_names() const {
    std::vector<std::vector<std::string>> out;
    for (const auto& b : buckets_) {
      out.emplace_back();
      for (size_t s : b.slots)
        out.back().push_back(names_[slots_[s].index]);
    }
    return out;
  }

  std::vector<at::Tensor> gradient_buffers() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<at::Tensor> out;
    if (options_.gradient_as_bucket_view()) {
      for (const auto& b : buckets_)
        out.push_back(b.buffer);
    } else {
      for (const auto& s : slots_) {
        if (s.param.grad().defined())
          out.push_back(s.param.grad());
      }
    }
    return out;
  }

  StepProfile last_profile() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_profile_;
  }

  bool synchronized() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return synchronized_;
  }

 private:
  struct Slot {
    at::Tensor param;
    size_t index = 0;  // in the user's named_parameters
    size_t bucket = 0;
    size_t pos = 0;   // within the bucket
    at::Tensor view;  // this parameter's segment of the bucket buffer
    int64_t passes = 0;
    NodePtr accumulator;
    uintptr_t hook_key = 0;
  };
  struct Bucket {
    std::vector<size_t> slots;
    at::Tensor buffer;
    at::Tensor flat;  // the gradients' segments: buffer less the mask
    at::Tensor mask;
    at::Tensor wire;  // the 16-bit copy sent when compressing
    size_t pending = 0;
    bool launched = false;
    Handle handle;
    // The collective's name: the bucket's index and first parameters, so
    // that errors and stall reports say which tensors are involved.
    std::string name;
  };

  // Whether this rank contributes the parameter's gradient to its bucket:
  // what pack() copies and what the used flags say must agree.
  static bool used_here(const Slot& s) {
    return s.passes > 0 && s.param.grad().defined();
  }

  // Moves the bucket's gradients into their segments, all in one batched
  // copy (one concatenation when every segment is copied; nothing for a
  // .grad that already is its segment), and zeroes the segments of
  // parameters that got no gradient here.
  void pack(Bucket& b) {
    const int64_t t0 = timeline_enabled() ? timeline_now_us() : -1;
    std::vector<at::Tensor> dst, src, unused;
    std::vector<Slot*> moved;
    for (size_t slot : b.slots) {
      Slot& s = slots_[slot];
      at::Tensor& grad = s.param.mutable_grad();
      if (!used_here(s)) {
        unused.push_back(s.view);  // contributes nothing, whatever it held
        continue;
      }
      if (grad.is_same(s.view))
        continue;
      dst.push_back(s.view);
      src.push_back(grad);
      moved.push_back(&s);
    }
    if (!dst.empty())
      pack_segments(b.flat, dst, src);
    if (!unused.empty())
      at::_foreach_zero_(unused);
    if (options_.gradient_as_bucket_view()) {
      for (Slot* s : moved)
        s->param.mutable_grad() = s->view;
    }
    if (t0 >= 0 && !(dst.empty() && unused.empty())) {
      timeline_span(
          "pack " + b.name,
          "pack",
          t0,
          timeline_now_us(),
          "\"tensors\":" + std::to_string(dst.size()));
    }
  }

  void launch_ready() {
    while (next_launch_ < buckets_.size() &&
           buckets_[next_launch_].pending == 0) {
      launch(next_launch_++);
    }
  }

  void launch(size_t bi) {
    Bucket& b = buckets_[bi];
    torch::NoGradGuard no_grad;
    pack(b);
    // The used flags: kernels on a device (a copy from host memory would
    // wait for the whole stream), one copy on the CPU.
    std::vector<float> used(b.slots.size());
    bool all_used = true;
    for (size_t pos = 0; pos < b.slots.size(); ++pos) {
      used[pos] = used_here(slots_[b.slots[pos]]) ? 1.0f : 0.0f;
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
    const double f = options_.gradient_predivide_factor();
    double post = f;
    const int64_t k = options_.backward_passes_per_step();
    if (k > 1 && options_.average_aggregated_gradients())
      post /= k;
    profile_.hooks_before_launch.push_back(hooks_);
    profile_.hooks = hooks_;
    at::Tensor target = b.buffer;
    if (options_.compression() != Compression::None &&
        (b.buffer.scalar_type() == at::kFloat ||
         b.buffer.scalar_type() == at::kDouble)) {
      const int64_t t0 = timeline_enabled() ? timeline_now_us() : -1;
      b.wire = b.buffer.to(wire_dtype(options_.compression()));
      target = b.wire;
      if (t0 >= 0) {
        timeline_span("compress " + b.name, "pack", t0, timeline_now_us());
      }
    } else {
      b.wire = at::Tensor();
    }
    b.handle = allreduce_async_(
        target,
        AllreduceOptions()
            .op(options_.op())
            .prescale_factor(1.0 / f)
            .postscale_factor(post)
            .name(b.name)
            // Bucket layouts were checked on the first step; later
            // steps skip the descriptor exchange.
            .verify(!verified_));
    b.launched = true;
  }

  DistributedOptimizerOptions options_;
  std::vector<std::string> names_;
  mutable std::mutex mutex_;  // guards everything below against hooks
  std::vector<Slot> slots_;   // in ready (reverse registration) order
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  bool synchronized_ = false;
  bool verified_ = false;
  int64_t hooks_ = 0;
  StepProfile profile_;
  StepProfile last_profile_;
};

}  // namespace detail

DistributedOptimizer::DistributedOptimizer(
    std::shared_ptr<torch::optim::Optimizer> optimizer,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const DistributedOptimizerOptions& options)
    : torch::optim::Optimizer(
          detail::forwarding_groups(*optimizer),
          std::make_unique<detail::ForwardingOptions>(optimizer.get(), -1)),
      optimizer_(std::move(optimizer)),
      options_(options) {
  TORCH_CHECK(
      optimizer_ != nullptr,
      "ronde: DistributedOptimizer needs an "
      "optimizer to wrap");
  // Optimizer's constructor merges group options with the defaults and may
  // keep a copy of the defaults instead: point each group at its twin again.
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(std::make_unique<detail::ForwardingOptions>(
        optimizer_.get(), static_cast<int>(g)));
  }
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& group : optimizer_->param_groups()) {
    groups.push_back(group.params());
  }
  check_param_groups_covered(named_parameters.values(), groups);
  reducer_ = std::make_unique<GradientReducer>(named_parameters, options_);
  lr_scale_factor_ = ronde::lr_scale_factor(
      options_.lr_scaling(),
      ronde::size(),
      options_.backward_passes_per_step());
  base_lrs_ = detail::remember_base_lrs(optimizer_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    optimizer_->param_groups()[g].options().set_lr(
        base_lrs_[g] * lr_scale_factor_);
  }
}

void check_param_groups_covered(
    const std::vector<torch::Tensor>& parameters,
    const std::vector<std::vector<torch::Tensor>>& param_groups) {
  std::unordered_set<const void*> known;
  for (const auto& p : parameters) {
    if (p.requires_grad())
      known.insert(p.unsafeGetTensorImpl());
  }
  for (size_t g = 0; g < param_groups.size(); ++g) {
    for (const auto& p : param_groups[g]) {
      TORCH_CHECK(
          !p.requires_grad() || known.count(p.unsafeGetTensorImpl()),
          "ronde: rank ",
          ronde::rank(),
          ": the wrapped optimizer's param group ",
          g,
          " holds a parameter ",
          p.scalar_type(),
          p.sizes(),
          " that is not among named_parameters; its gradient would "
          "never be averaged");
    }
  }
}

GradientReducer::GradientReducer(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const DistributedOptimizerOptions& options)
    : GradientReducer(
          named_parameters.keys(), named_parameters.values(), options) {}

GradientReducer::GradientReducer(
    const std::vector<std::string>& names,
    const std::vector<torch::Tensor>& parameters,
    const DistributedOptimizerOptions& options)
    : options_(options) {
  TORCH_CHECK(
      names.size() == parameters.size(),
      "ronde: GradientReducer got ",
      names.size(),
      " names for ",
      parameters.size(),
      " parameters");
  std::vector<at::Tensor> params;
  std::vector<std::string> lines;
  for (size_t i = 0; i < names.size(); ++i) {
    TORCH_CHECK(
        parameters[i].defined(),
        "ronde: parameter '",
        names[i],
        "' is an undefined tensor");
    if (!parameters[i].requires_grad())
      continue;
    names_.push_back(names[i]);
    params.push_back(parameters[i]);
    lines.push_back(detail::describe_tensor(names[i], parameters[i]));
  }
  detail::check_same_everywhere("DistributedOptimizer parameters", lines);
  engine_ = std::make_shared<detail::GradientEngine>(names_, params, options_);
  engine_->install_hooks();
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::synchronize() {
  engine_->synchronize();
}

bool GradientReducer::synchronized() const {
  return engine_->synchronized();
}

void GradientReducer::finish_step() {
  engine_->reset();
}

void GradientReducer::skip_step() {
  engine_->synchronize();
  engine_->reset();
}

std::vector<torch::Tensor> GradientReducer::gradient_buffers() const {
  return engine_->gradient_buffers();
}

std::vector<std::vector<std::string>> GradientReducer::buckets() const {
  return engine_->bucket_names();
}

StepProfile GradientReducer::last_step_profile() const {
  return engine_->last_profile();
}

void DistributedOptimizer::skip_step() {
  reducer_->skip_step();
}

std::vector<torch::Tensor> DistributedOptimizer::gradient_buffers() const {
  return reducer_->gradient_buffers();
}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::synchronize() {
  reducer_->synchronize();
}

torch::Tensor DistributedOptimizer::step(LossClosure closure) {
  if (!closure) {
    reducer_->synchronize();
    torch::Tensor out;
    {
      TimelineRange span("optimizer step", "step");
      out = optimizer_->step();
    }
    reducer_->finish_step();
    return out;
  }
  TORCH_CHECK(
      options_.backward_passes_per_step() == 1,
      "ronde: step(closure) evaluates the closure itself; use "
      "backward_passes_per_step = 1 with it");
  // Each evaluation is one synchronised backward pass, and its loss the
  // mean over ranks: line searches then decide alike on every rank.
  auto synced = [&]() -> torch::Tensor {
    reducer_->finish_step();
    torch::Tensor loss = closure();
    reducer_->synchronize();
    if (!loss.defined())
      return loss;
    return ronde::allreduce(
        loss.detach(), AllreduceOptions().name("ronde.closure_loss"));
  };
  torch::Tensor out;
  {
    TimelineRange span("optimizer step", "step");
    out = optimizer_->step(synced);
  }
  reducer_->finish_step();
  return out;
}

void DistributedOptimizer::zero_grad(bool set_to_none) {
  optimizer_->zero_grad(set_to_none);
}

void DistributedOptimizer::save(
    torch::serialize::OutputArchive& archive) const {
  optimizer_->save(archive);
  archive.write("ronde_base_lrs", at::tensor(base_lrs_, at::kDouble));
}

void DistributedOptimizer::load(torch::serialize::InputArchive& archive) {
  // The saved LRs are already scaled: they are restored as they are, and the
  // saved base LRs keep any later wrapping from scaling them again.
  optimizer_->load(archive);
  at::Tensor base;
  if (archive.try_read("ronde_base_lrs", base) &&
      base.numel() == static_cast<int64_t>(base_lrs_.size())) {
    for (size_t g = 0; g < base_lrs_.size(); ++g) {
      base_lrs_[g] = base[g].item<double>();
    }
    detail::set_base_lrs(optimizer_, base_lrs_);
  }
}

std::vector<std::vector<std::string>> DistributedOptimizer::buckets() const {
  return reducer_->buckets();
}

StepProfile DistributedOptimizer::last_step_profile() const {
  return reducer_->last_step_profile();
}

void broadcast_parameters(
    const torch::OrderedDict<std::string, torch::Tensor>& named_tensors,
    int root_rank) {
  std::vector<std::string> lines;
  for (const auto& item : named_tensors) {
    lines.push_back(detail::describe_tensor(item.key(), item.value()));
  }
  detail::check_same_everywhere("broadcast_parameters", lines);
  torch::NoGradGuard no_grad;
  // One broadcast per dtype and device, in first-seen order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<at::Tensor>> groups;
  for (const auto& item : named_tensors) {
    const std::string key = detail::dtype_device_key(item.value());
    if (!groups.count(key))
      order.push_back(key);
    groups[key].push_back(item.value());
  }
  for (const auto& key : order) {
    auto& tensors = groups[key];
    std::vector<at::Tensor> flat;
    for (auto& t : tensors)
      flat.push_back(t.reshape({-1}));
    at::Tensor buffer = at::cat(flat);
    broadcast_(
        buffer,
        root_rank,
        CollectiveOptions().name("ronde.broadcast_parameters." + key));
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(buffer.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void broadcast_optimizer_state(
    torch::optim::Optimizer& optimizer, int root_rank) {
  std::string bytes;
  if (ronde::rank() == root_rank) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream os;
    archive.save_to(os);
    bytes = os.str();
  }
  at::Tensor len = ronde::broadcast(
      at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong),
      root_rank,
      CollectiveOptions().name("ronde.optimizer_state.size"));
  at::Tensor data = at::empty({len.item<int64_t>()}, at::kByte);
  if (ronde::rank() == root_rank) {
    std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  }
  broadcast_(
      data, root_rank, CollectiveOptions().name("ronde.optimizer_state"));
  if (ronde::rank() != root_rank) {
    std::istringstream is(
        std::string(static_cast<const char*>(data.data_ptr()), data.numel()));
    torch::serialize::InputArchive archive;
    archive.load_from(is);
    optimizer.load(archive);
  }
}

}  // namespace ronde
