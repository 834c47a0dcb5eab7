// ronde's c10d backend (ronde/c10d.h): each c10d operation becomes ronde
// collectives on the group's process set, and its Work completes when they
// did (c10d/work.h). Tensors are reshaped so that ronde's cross-rank check
// sees what c10d requires to agree: an allgather sends [1, numel], so ranks
// whose inputs differ in shape or type fail alike with ronde's message.
// A call torch waits on at once (asyncOp false) may run on the caller's
// thread, as ronde's blocking forms do; the others are queued. Point to
// point messages are in c10d/p2p.cpp.
// The private headers first: they name torch's c10d as `c10d::` inside
// namespace ronde, which ronde/c10d.h makes mean ronde::c10d.
#include "c10d/p2p.h"
#include "c10d/work.h"
#include "comm/collective_calls.h"
#include "comm/world.h"
#include "init/runtime.h"

#include <ronde/c10d.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <functional>
#include <numeric>

namespace ronde::c10d {
namespace {

using ::c10d::OpType;
using ronde::detail::C10dWork;

// The host and port of the TCPStore under `store`'s prefixes; empty when
// the store is of another kind (FileStore, HashStore).
std::pair<std::string, int> store_address(
    const c10::intrusive_ptr<::c10d::Store>& store) {
  c10::intrusive_ptr<::c10d::Store> s = store;
  if (auto* prefix = dynamic_cast<::c10d::PrefixStore*>(s.get()))
    s = prefix->getUnderlyingNonPrefixStore();
  if (auto* tcp = dynamic_cast<::c10d::TCPStore*>(s.get()))
    return {tcp->getHost(), static_cast<int>(tcp->getPort())};
  return {"", 0};
}

// ronde's reduction for c10d's, and the factor PREMUL_SUM multiplies by.
ReduceOp reduction(const ::c10d::ReduceOp& op, const char* what, double* pre) {
  *pre = 1.0;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM:
      return ReduceOp::Sum;
    case ::c10d::ReduceOp::AVG:
      return ReduceOp::Average;
    case ::c10d::ReduceOp::PRODUCT:
      return ReduceOp::Product;
    case ::c10d::ReduceOp::MIN:
      return ReduceOp::Min;
    case ::c10d::ReduceOp::MAX:
      return ReduceOp::Max;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<::c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "ronde: ", what, ": PREMUL_SUM without its factor");
      *pre = s->tensor_factor.defined() ? s->tensor_factor.item<double>()
                                        : s->double_factor;
      return ReduceOp::Sum;
    }
    default:
      break;
  }
  TORCH_CHECK(
      false,
      "ronde: ",
      what,
      ": ReduceOp ",
      static_cast<int>(op.op_),
      " (BAND, BOR or BXOR) is not supported; ronde reduces with SUM, AVG, "
      "PREMUL_SUM, PRODUCT, MIN and MAX");
}

at::Tensor one(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(
      tensors.size() == 1,
      "ronde: ",
      what,
      " takes one tensor per call, got ",
      tensors.size());
  return tensors[0];
}

at::Tensor row(const at::Tensor& t) {
  return t.reshape({1, -1});
}

// Copies `from` (any shape, as many elements) into `to`, unless it is
// already there.
void copy_into(const at::Tensor& to, const at::Tensor& from) {
  if (to.is_contiguous() && from.data_ptr() == to.data_ptr())
    return;
  to.copy_(from.reshape(to.sizes()));
}

// Copies the consecutive pieces of the flat `from` into `outputs`.
void scatter_into(const std::vector<at::Tensor>& outputs, const at::Tensor& from) {
  const at::Tensor flat = from.reshape({-1});
  int64_t offset = 0;
  for (const at::Tensor& out : outputs) {
    TORCH_CHECK(
        offset + out.numel() <= flat.numel(),
        "ronde: the outputs hold more elements than the collective gave");
    copy_into(out, flat.narrow(0, offset, out.numel()));
    offset += out.numel();
  }
}

at::Tensor flat_cat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const at::Tensor& t : tensors)
    flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void check_same_count(
    const std::vector<at::Tensor>& tensors, int n, const char* what) {
  TORCH_CHECK(
      static_cast<int>(tensors.size()) == n,
      "ronde: ",
      what,
      " needs one tensor per rank of the group (",
      n,
      "), got ",
      tensors.size());
}

}  // namespace

Backend::Backend(const BackendOptions& o)
    : ::c10d::Backend(o.rank, o.size),
      global_ranks_(o.global_ranks),
      name_(o.group_name),
      timeout_(o.timeout) {
  if (global_ranks_.empty()) {
    // The default group: ronde's world, started from its store if need be.
    const auto [addr, port] = store_address(o.store);
    ronde::detail::attach_to_store(o.store, o.rank, o.size, o.timeout, addr, port);
    global_ranks_.resize(o.size);
    std::iota(global_ranks_.begin(), global_ranks_.end(), 0);
    p2p_ = std::make_unique<ronde::detail::PointToPoint>(global_ranks_, name_);
    return;
  }
  TORCH_CHECK(
      is_initialized(),
      "ronde: process group '", o.group_name, "' needs ronde's world first: "
      "create the default group with init_process_group(\"ronde\"), or call "
      "ronde.init()");
  TORCH_CHECK(
      static_cast<int>(global_ranks_.size()) == o.size && o.rank >= 0 &&
          o.rank < o.size && global_ranks_[o.rank] == ronde::rank(),
      "ronde: process group '", o.group_name, "' says this process is rank ",
      o.rank, " of ", o.size, " with global ranks ",
      ronde::detail::rank_list(global_ranks_), ", but it is rank ",
      ronde::rank(), " of ronde's world");
  set_ = ronde::detail::add_member_set(global_ranks_, o.group_name);
  p2p_ = std::make_unique<ronde::detail::PointToPoint>(global_ranks_, name_);
}

Backend::~Backend() {
  p2p_.reset();  // waits for its connection attempts
  try {
    ronde::detail::drop_member_set(set_);
  } catch (const std::exception&) {
  }
}

// Runs one operation: `start` submits its collectives; `finish` copies
// their results into torch's outputs once they are done.
template <class Start>
c10::intrusive_ptr<::c10d::Work> launch(
    int rank,
    const std::string& group,
    OpType type,
    const char* op,
    std::vector<at::Tensor> outputs,
    Start start,
    std::function<void()> finish = {}) {
  std::string what = std::string(op) + " on rank " + std::to_string(rank);
  if (group != "0")
    what += " of process group '" + group + "'";
  auto work = c10::make_intrusive<C10dWork>(rank, type, what, std::move(outputs));
  std::vector<Handle> handles;
  try {
    handles = start();
  } catch (...) {
    work->complete(std::current_exception());
    return work;
  }
  ronde::detail::complete_when_done(work, std::move(handles), std::move(finish));
  return work;
}

#define RONDE_LAUNCH(type, op, outputs, ...) \
  launch(rank_, name_, OpType::type, op, outputs, __VA_ARGS__)

c10::intrusive_ptr<::c10d::Work> Backend::broadcast(
    std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  return RONDE_LAUNCH(BROADCAST, "broadcast", tensors, [&] {
    const at::Tensor t = one(tensors, "broadcast");
    return std::vector<Handle>{ronde::detail::broadcast_call(
        t, static_cast<int>(opts.rootRank),
        CollectiveOptions().process_set(set_), true, !opts.asyncOp)};
  });
}

c10::intrusive_ptr<::c10d::Work> Backend::allreduce(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  return RONDE_LAUNCH(ALLREDUCE, "allreduce", tensors, [&] {
    const at::Tensor t = one(tensors, "allreduce");
    double pre = 1.0;
    const ReduceOp op = reduction(opts.reduceOp, "allreduce", &pre);
    return std::vector<Handle>{ronde::detail::allreduce_call(
        t,
        AllreduceOptions().op(op).prescale_factor(pre).process_set(set_),
        true,
        !opts.asyncOp)};
  });
}

c10::intrusive_ptr<::c10d::Work> Backend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const ::c10d::AllreduceCoalescedOptions& opts) {
  auto flat = std::make_shared<at::Tensor>();
  return RONDE_LAUNCH(
      ALLREDUCE_COALESCED, "allreduce_coalesced", tensors,
      [&] {
        for (const at::Tensor& t : tensors) {
          TORCH_CHECK(
              t.scalar_type() == tensors[0].scalar_type(),
              "ronde: allreduce_coalesced needs tensors of one type, got ",
              tensors[0].scalar_type(), " and ", t.scalar_type());
        }
        *flat = flat_cat(tensors);
        double pre = 1.0;
        const ReduceOp op = reduction(opts.reduceOp, "allreduce_coalesced", &pre);
        return std::vector<Handle>{ronde::detail::allreduce_call(
            *flat,
            AllreduceOptions().op(op).prescale_factor(pre).process_set(set_),
            true,
            !opts.asyncOp)};
      },
      [tensors, flat] { scatter_into(tensors, *flat); });
}

c10::intrusive_ptr<::c10d::Work> Backend::reduce(
    std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) {
  // ronde has no reduce: an all-reduce, whose result only the root keeps
  // (the others' tensors stay as they were).
  const bool root = opts.rootRank == rank_;
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      REDUCE, "reduce", tensors,
      [&] {
        const at::Tensor t = one(tensors, "reduce");
        TORCH_CHECK(
            opts.rootRank >= 0 && opts.rootRank < size_,
            "ronde: reduce: root rank ", opts.rootRank, " is outside [0, ",
            size_, ")");
        double pre = 1.0;
        const ReduceOp op = reduction(opts.reduceOp, "reduce", &pre);
        *handle = ronde::detail::allreduce_call(
            t,
            AllreduceOptions().op(op).prescale_factor(pre).process_set(set_),
            /*in_place=*/root,
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  auto handle = std::make_shared<Handle>();
  TORCH_CHECK(outputs.size() == 1, "ronde: allgather takes one output list");
  std::vector<at::Tensor> outs = outputs[0];
  return RONDE_LAUNCH(
      ALLGATHER, "allgather", outs,
      [&] {
        check_same_count(outs, size_, "allgather");
        *handle = ronde::detail::allgather_call(
            row(one(inputs, "allgather")),
            CollectiveOptions().process_set(set_), !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outs, handle] { scatter_into(outs, handle->result()); });
}

c10::intrusive_ptr<::c10d::Work> Backend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      _ALLGATHER_BASE, "allgather_into_tensor", {output},
      [&] {
        TORCH_CHECK(
            output.numel() == input.numel() * size_,
            "ronde: allgather_into_tensor: the output has ", output.numel(),
            " elements, not ", size_, " x ", input.numel());
        *handle = ronde::detail::allgather_call(
            row(input), CollectiveOptions().process_set(set_), !opts.asyncOp,
            output.is_contiguous() ? output : at::Tensor());
        return std::vector<Handle>{*handle};
      },
      [output, handle] { copy_into(output, handle->result()); });
}

c10::intrusive_ptr<::c10d::Work> Backend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& /*opts*/) {
  auto handles = std::make_shared<std::vector<Handle>>();
  std::vector<at::Tensor> all;
  for (const auto& list : outputs)
    all.insert(all.end(), list.begin(), list.end());
  return RONDE_LAUNCH(
      ALLGATHER_COALESCED, "allgather_coalesced", all,
      [&] {
        TORCH_CHECK(
            outputs.size() == inputs.size(),
            "ronde: allgather_coalesced: ", outputs.size(),
            " output lists for ", inputs.size(), " inputs");
        for (size_t i = 0; i < inputs.size(); ++i) {
          check_same_count(outputs[i], size_, "allgather_coalesced");
          handles->push_back(ronde::detail::allgather_call(
              row(inputs[i]), CollectiveOptions().process_set(set_), false));
        }
        return *handles;
      },
      [outputs, handles] {
        for (size_t i = 0; i < outputs.size(); ++i)
          scatter_into(outputs[i], (*handles)[i].result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& /*opts*/) {
  auto handles = std::make_shared<std::vector<Handle>>();
  return RONDE_LAUNCH(
      COALESCED, "allgather_into_tensor_coalesced", outputs,
      [&] {
        TORCH_CHECK(
            outputs.size() == inputs.size(),
            "ronde: allgather_into_tensor_coalesced: ", outputs.size(),
            " outputs for ", inputs.size(), " inputs");
        for (size_t i = 0; i < inputs.size(); ++i) {
          TORCH_CHECK(
              outputs[i].numel() == inputs[i].numel() * size_,
              "ronde: allgather_into_tensor_coalesced: output ", i, " has ",
              outputs[i].numel(), " elements, not ", size_, " x ",
              inputs[i].numel());
          handles->push_back(ronde::detail::allgather_call(
              row(inputs[i]), CollectiveOptions().process_set(set_), false,
              outputs[i].is_contiguous() ? outputs[i] : at::Tensor()));
        }
        return *handles;
      },
      [outputs, handles] {
        for (size_t i = 0; i < outputs.size(); ++i)
          copy_into(outputs[i], (*handles)[i].result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::GatherOptions& opts) {
  // An allgather, kept by the root only.
  auto handle = std::make_shared<Handle>();
  const bool root = opts.rootRank == rank_;
  std::vector<at::Tensor> outs = root && !outputs.empty() ? outputs[0]
                                                          : std::vector<at::Tensor>{};
  return RONDE_LAUNCH(
      GATHER, "gather", outs,
      [&] {
        TORCH_CHECK(
            opts.rootRank >= 0 && opts.rootRank < size_,
            "ronde: gather: root rank ", opts.rootRank, " is outside [0, ",
            size_, ")");
        if (root)
          check_same_count(outs, size_, "gather (on the root)");
        *handle = ronde::detail::allgather_call(
            row(one(inputs, "gather")), CollectiveOptions().process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outs, handle, root] {
        if (root)
          scatter_into(outs, handle->result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ScatterOptions& opts) {
  // An alltoall in which only the root sends.
  auto handle = std::make_shared<Handle>();
  const int root = static_cast<int>(opts.rootRank);
  return RONDE_LAUNCH(
      SCATTER, "scatter", outputs,
      [&] {
        const at::Tensor out = one(outputs, "scatter");
        TORCH_CHECK(
            root >= 0 && root < size_, "ronde: scatter: root rank ", root,
            " is outside [0, ", size_, ")");
        std::vector<int64_t> splits(size_, 0);
        at::Tensor send;
        if (root == rank_) {
          TORCH_CHECK(inputs.size() == 1, "ronde: scatter takes one input list");
          check_same_count(inputs[0], size_, "scatter (on the root)");
          for (int r = 0; r < size_; ++r)
            splits[r] = inputs[0][r].numel();
          send = flat_cat(inputs[0]);
        } else {
          send = at::empty({0}, out.options());
        }
        *handle = ronde::detail::alltoall_call(
            send, AlltoallOptions().splits(splits).process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outputs, handle, root] {
        const std::vector<int64_t> got = handle->received_splits();
        TORCH_CHECK(
            got[root] == outputs[0].numel(),
            "ronde: scatter: the root sent ", got[root],
            " elements to an output of ", outputs[0].numel());
        copy_into(outputs[0], handle->result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      REDUCE_SCATTER, "reduce_scatter", outputs,
      [&] {
        const at::Tensor out = one(outputs, "reduce_scatter");
        TORCH_CHECK(inputs.size() == 1, "ronde: reduce_scatter takes one input list");
        check_same_count(inputs[0], size_, "reduce_scatter");
        std::vector<at::Tensor> rows;
        for (const at::Tensor& t : inputs[0])
          rows.push_back(row(t));
        double pre = 1.0;
        const ReduceOp op = reduction(opts.reduceOp, "reduce_scatter", &pre);
        *handle = ronde::detail::reducescatter_call(
            at::cat(rows),
            ReducescatterOptions().op(op).prescale_factor(pre).process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outputs, handle] { copy_into(outputs[0], handle->result()); });
}

namespace {

// The input of a reduce-scatter into `output`, as rows of one rank's part:
// [size, output.numel()] when the input holds size x that; as it is (ronde's
// check then fails the call on every rank) when not.
at::Tensor scatter_rows(const at::Tensor& input, const at::Tensor& output, int size) {
  if (input.numel() == output.numel() * size)
    return input.reshape({size, -1});
  return input.reshape({-1});
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> Backend::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const ::c10d::ReduceScatterOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      _REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output},
      [&] {
        double pre = 1.0;
        const ReduceOp op = reduction(opts.reduceOp, "reduce_scatter_tensor", &pre);
        *handle = ronde::detail::reducescatter_call(
            scatter_rows(input, output, size_),
            ReducescatterOptions().op(op).prescale_factor(pre).process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [output, handle] {
        const at::Tensor r = handle->result();
        TORCH_CHECK(
            r.numel() == output.numel(),
            "ronde: reduce_scatter_tensor: this rank's part has ", r.numel(),
            " elements, the output ", output.numel());
        copy_into(output, r);
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  auto handles = std::make_shared<std::vector<Handle>>();
  return RONDE_LAUNCH(
      COALESCED, "reduce_scatter_tensor_coalesced", outputs,
      [&] {
        TORCH_CHECK(
            outputs.size() == inputs.size(),
            "ronde: reduce_scatter_tensor_coalesced: ", outputs.size(),
            " outputs for ", inputs.size(), " inputs");
        double pre = 1.0;
        const ReduceOp op =
            reduction(opts.reduceOp, "reduce_scatter_tensor_coalesced", &pre);
        for (size_t i = 0; i < inputs.size(); ++i) {
          handles->push_back(ronde::detail::reducescatter_call(
              scatter_rows(inputs[i], outputs[i], size_),
              ReducescatterOptions().op(op).prescale_factor(pre).process_set(set_),
              false));
        }
        return *handles;
      },
      [outputs, handles] {
        for (size_t i = 0; i < outputs.size(); ++i) {
          const at::Tensor r = (*handles)[i].result();
          TORCH_CHECK(
              r.numel() == outputs[i].numel(),
              "ronde: reduce_scatter_tensor_coalesced: output ", i, " has ",
              outputs[i].numel(), " elements, this rank's part ", r.numel());
          copy_into(outputs[i], r);
        }
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits,
    const ::c10d::AllToAllOptions& opts) {
  auto handle = std::make_shared<Handle>();
  std::vector<int64_t> expect = output_splits;
  if (expect.empty() && output.dim() > 0) {
    TORCH_CHECK(
        output.size(0) % size_ == 0,
        "ronde: all_to_all_single: the output's ", output.size(0),
        " rows do not split evenly over ", size_, " ranks");
    expect.assign(size_, output.size(0) / size_);
  }
  return RONDE_LAUNCH(
      ALLTOALL_BASE, "all_to_all_single", {output},
      [&] {
        at::Tensor in = input.dim() == 0 ? input.reshape({1}) : input;
        *handle = ronde::detail::alltoall_call(
            in, AlltoallOptions().splits(input_splits).process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [output, handle, expect] {
        const std::vector<int64_t> got = handle->received_splits();
        TORCH_CHECK(
            got == expect,
            "ronde: all_to_all_single: the ranks sent ",
            c10::IntArrayRef(got), " rows, where this rank expects ",
            c10::IntArrayRef(expect));
        copy_into(output, handle->result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllToAllOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      ALLTOALL, "all_to_all", outputs,
      [&] {
        check_same_count(inputs, size_, "all_to_all");
        check_same_count(outputs, size_, "all_to_all");
        std::vector<int64_t> splits;
        for (const at::Tensor& t : inputs)
          splits.push_back(t.numel());
        *handle = ronde::detail::alltoall_call(
            flat_cat(inputs), AlltoallOptions().splits(splits).process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outputs, handle] {
        const std::vector<int64_t> got = handle->received_splits();
        for (size_t r = 0; r < outputs.size(); ++r) {
          TORCH_CHECK(
              got[r] == outputs[r].numel(),
              "ronde: all_to_all: rank ", r, " sent ", got[r],
              " elements to an output of ", outputs[r].numel());
        }
        scatter_into(outputs, handle->result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::barrier(
    const ::c10d::BarrierOptions& opts) {
  return RONDE_LAUNCH(BARRIER, "barrier", {}, [&] {
    return std::vector<Handle>{ronde::detail::barrier_call(set_, !opts.asyncOp)};
  });
}

void Backend::monitoredBarrier(
    const ::c10d::BarrierOptions& /*opts*/, bool /*wait_all_ranks*/) {
  // ronde's barrier already names the ranks that did not come (the
  // failure notices), within ronde's timeout.
  ronde::detail::barrier_call(set_, true).wait();
}

c10::intrusive_ptr<::c10d::Work> Backend::send(
    std::vector<at::Tensor>& tensors, int dst, int /*tag*/) {
  return RONDE_LAUNCH(SEND, "send", tensors, [&] {
    return std::vector<Handle>{
        p2p_->post(one(tensors, "send"), rank_, dst, /*sending=*/true)};
  });
}

c10::intrusive_ptr<::c10d::Work> Backend::recv(
    std::vector<at::Tensor>& tensors, int src, int /*tag*/) {
  return RONDE_LAUNCH(RECV, "recv", tensors, [&] {
    return std::vector<Handle>{
        p2p_->post(one(tensors, "recv"), src, rank_, /*sending=*/false)};
  });
}

c10::intrusive_ptr<::c10d::Work> Backend::recvAnysource(
    std::vector<at::Tensor>& /*tensors*/, int /*tag*/) {
  TORCH_CHECK(
      false,
      "ronde: recv without a source rank is not supported: ronde matches "
      "messages per pair of ranks; name the sender (dist.recv(t, src=...))");
}

c10::intrusive_ptr<::c10d::ProcessGroup> new_process_group(
    const c10::intrusive_ptr<::c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout) {
  BackendOptions o;
  o.store = store;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  auto backend = c10::make_intrusive<Backend>(o);
  auto pg = c10::make_intrusive<::c10d::ProcessGroup>(store, rank, size);
  pg->setDefaultBackend(::c10d::ProcessGroup::BackendType::CUSTOM);
  pg->setBackend(
      c10::DeviceType::CPU, ::c10d::ProcessGroup::BackendType::CUSTOM, backend);
  return pg;
}

}  // namespace ronde::c10d
