// ronde's c10d backend (ronde/c10d.h): each c10d operation becomes ronde
// collectives on the group's process set, and its Work completes when they
// did (c10d/work.h). Tensors are reshaped so that ronde's cross-rank check
// sees what c10d requires to agree: an allgather sends [1, numel], so ranks
// whose inputs differ in shape or type fail alike with ronde's message.
// A call torch waits on at once (asyncOp false) may run on the caller's
// thread, as ronde's blocking forms do; the others are queued. Gather,
// scatter, reduce-scatter and all-to-all are in c10d/scatter.cpp, point to
// point messages in c10d/p2p.cpp.
// The private headers first: they name torch's c10d as `c10d::` inside
// namespace ronde, which ronde/c10d.h makes mean ronde::c10d.
#include "c10d/ops.h"
#include "c10d/p2p.h"
#include "comm/collective_calls.h"
#include "comm/world.h"
#include "init/runtime.h"

#include <ronde/c10d.h>
#include <ronde/runtime.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <numeric>
#include <string>
#include <utility>

namespace ronde::c10d {

using namespace ronde::detail::c10d_ops;

namespace {

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

}  // namespace

Backend::Backend(const BackendOptions& o)
    : ::c10d::Backend(o.rank, o.size),
      global_ranks_(o.global_ranks),
      name_(o.group_name),
      timeout_(o.timeout) {
  if (global_ranks_.empty()) {
    // The default group: ronde's world, started from its store if need be.
    const auto [addr, port] = store_address(o.store);
    ronde::detail::attach_to_store(
        o.store, o.rank, o.size, o.timeout, addr, port);
    global_ranks_.resize(o.size);
    std::iota(global_ranks_.begin(), global_ranks_.end(), 0);
    p2p_ = std::make_unique<ronde::detail::PointToPoint>(
        global_ranks_, name_, o.rank, o.store);
    return;
  }
  TORCH_CHECK(
      is_initialized(),
      "ronde: process group '",
      o.group_name,
      "' needs ronde's world first: "
      "create the default group with init_process_group(\"ronde\"), or call "
      "ronde.init()");
  TORCH_CHECK(
      static_cast<int>(global_ranks_.size()) == o.size && o.rank >= 0 &&
          o.rank < o.size && global_ranks_[o.rank] == ronde::rank(),
      "ronde: process group '",
      o.group_name,
      "' says this process is rank ",
      o.rank,
      " of ",
      o.size,
      " with global ranks ",
      ronde::detail::rank_list(global_ranks_),
      ", but it is rank ",
      ronde::rank(),
      " of ronde's world");
  set_ = ronde::detail::add_member_set(global_ranks_, o.group_name);
  p2p_ = std::make_unique<ronde::detail::PointToPoint>(
      global_ranks_, name_, o.rank, o.store);
}

Backend::~Backend() {
  p2p_.reset();  // waits for its connection attempts
  try {
    ronde::detail::drop_member_set(set_);
  } catch (const std::exception&) {
  }
}

c10::intrusive_ptr<::c10d::Work> Backend::broadcast(
    std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  return RONDE_LAUNCH(BROADCAST, "broadcast", tensors, [&] {
    const at::Tensor t = one(tensors, "broadcast");
    return std::vector<Handle>{ronde::detail::broadcast_call(
        t,
        static_cast<int>(opts.rootRank),
        CollectiveOptions().process_set(set_),
        true,
        !opts.asyncOp)};
  });
}

c10::intrusive_ptr<::c10d::Work> Backend::allreduce(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].scalar_type() == at::kBool)
    return allreduce_bool(tensors, opts);
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

// A bool all-reduce, as gloo's: SUM, MAX and BOR are a logical or; PRODUCT,
// MIN and BAND a logical and. ronde reduces bytes, 0 or 1, with max or min.
c10::intrusive_ptr<::c10d::Work> Backend::allreduce_bool(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  auto bytes = std::make_shared<at::Tensor>();
  const at::Tensor t = tensors[0];
  return RONDE_LAUNCH(
      ALLREDUCE,
      "allreduce",
      tensors,
      [&] {
        const auto op = opts.reduceOp.op_;
        const bool any = op == ::c10d::ReduceOp::SUM ||
                         op == ::c10d::ReduceOp::MAX ||
                         op == ::c10d::ReduceOp::BOR;
        const bool all = op == ::c10d::ReduceOp::PRODUCT ||
                         op == ::c10d::ReduceOp::MIN ||
                         op == ::c10d::ReduceOp::BAND;
        TORCH_CHECK(
            any || all,
            "ronde: allreduce of a bool tensor takes SUM, MAX or BOR (or), "
            "PRODUCT, MIN or BAND (and), not ReduceOp ",
            static_cast<int>(op));
        *bytes = t.to(at::kByte).contiguous();
        return std::vector<Handle>{ronde::detail::allreduce_call(
            *bytes,
            AllreduceOptions()
                .op(any ? ReduceOp::Max : ReduceOp::Min)
                .process_set(set_),
            true,
            !opts.asyncOp)};
      },
      [t, bytes] { t.copy_(bytes->ne(0)); });
}

c10::intrusive_ptr<::c10d::Work> Backend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const ::c10d::AllreduceCoalescedOptions& opts) {
  auto flat = std::make_shared<at::Tensor>();
  return RONDE_LAUNCH(
      ALLREDUCE_COALESCED,
      "allreduce_coalesced",
      tensors,
      [&] {
        for (const at::Tensor& t : tensors) {
          TORCH_CHECK(
              t.scalar_type() == tensors[0].scalar_type(),
              "ronde: allreduce_coalesced needs tensors of one type, got ",
              tensors[0].scalar_type(),
              " and ",
              t.scalar_type());
        }
        *flat = flat_cat(tensors);
        double pre = 1.0;
        const ReduceOp op =
            reduction(opts.reduceOp, "allreduce_coalesced", &pre);
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
  return RONDE_LAUNCH(REDUCE, "reduce", tensors, [&] {
    const at::Tensor t = one(tensors, "reduce");
    TORCH_CHECK(
        opts.rootRank >= 0 && opts.rootRank < size_,
        "ronde: reduce: root rank ",
        opts.rootRank,
        " is outside [0, ",
        size_,
        ")");
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
      ALLGATHER,
      "allgather",
      outs,
      [&] {
        const at::Tensor input = one(inputs, "allgather");
        check_same_count(outs, size_, "allgather");
        check_outputs_match(outs, input, "allgather");
        *handle = ronde::detail::allgather_call(
            row(input), CollectiveOptions().process_set(set_), !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outs, handle] { scatter_into(outs, handle->result()); });
}

c10::intrusive_ptr<::c10d::Work> Backend::_allgather_base(
    at::Tensor& output,
    at::Tensor& input,
    const ::c10d::AllgatherOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      _ALLGATHER_BASE,
      "allgather_into_tensor",
      {output},
      [&] {
        TORCH_CHECK(
            output.numel() == input.numel() * size_,
            "ronde: allgather_into_tensor: the output has ",
            output.numel(),
            " elements, not ",
            size_,
            " x ",
            input.numel());
        *handle = ronde::detail::allgather_call(
            row(input),
            CollectiveOptions().process_set(set_),
            !opts.asyncOp,
            output.is_contiguous() ? output : at::Tensor());
        return std::vector<Handle>{*handle};
      },
      [output, handle] { copy_into(output, handle->result()); });
}

// c10d's layout: outputs[r][i] receives rank r's inputs[i].
c10::intrusive_ptr<::c10d::Work> Backend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& /*opts*/) {
  auto handles = std::make_shared<std::vector<Handle>>();
  // by_input[i]: every rank's inputs[i], in rank order.
  auto by_input = std::make_shared<std::vector<std::vector<at::Tensor>>>();
  std::vector<at::Tensor> all;
  for (const auto& list : outputs)
    all.insert(all.end(), list.begin(), list.end());
  return RONDE_LAUNCH(
      ALLGATHER_COALESCED,
      "allgather_coalesced",
      all,
      [&] {
        TORCH_CHECK(
            static_cast<int>(outputs.size()) == size_,
            "ronde: allgather_coalesced needs one output list per rank of "
            "the group (",
            size_,
            "), got ",
            outputs.size());
        by_input->assign(inputs.size(), {});
        for (size_t r = 0; r < outputs.size(); ++r) {
          TORCH_CHECK(
              outputs[r].size() == inputs.size(),
              "ronde: allgather_coalesced: output list ",
              r,
              " holds ",
              outputs[r].size(),
              " tensors for ",
              inputs.size(),
              " inputs");
          for (size_t i = 0; i < inputs.size(); ++i)
            (*by_input)[i].push_back(outputs[r][i]);
        }
        for (size_t i = 0; i < inputs.size(); ++i) {
          check_outputs_match((*by_input)[i], inputs[i], "allgather_coalesced");
          handles->push_back(ronde::detail::allgather_call(
              row(inputs[i]), CollectiveOptions().process_set(set_), false));
        }
        return *handles;
      },
      [by_input, handles] {
        for (size_t i = 0; i < by_input->size(); ++i)
          scatter_into((*by_input)[i], (*handles)[i].result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& /*opts*/) {
  auto handles = std::make_shared<std::vector<Handle>>();
  return RONDE_LAUNCH(
      COALESCED,
      "allgather_into_tensor_coalesced",
      outputs,
      [&] {
        TORCH_CHECK(
            outputs.size() == inputs.size(),
            "ronde: allgather_into_tensor_coalesced: ",
            outputs.size(),
            " outputs for ",
            inputs.size(),
            " inputs");
        for (size_t i = 0; i < inputs.size(); ++i) {
          TORCH_CHECK(
              outputs[i].numel() == inputs[i].numel() * size_,
              "ronde: allgather_into_tensor_coalesced: output ",
              i,
              " has ",
              outputs[i].numel(),
              " elements, not ",
              size_,
              " x ",
              inputs[i].numel());
          handles->push_back(ronde::detail::allgather_call(
              row(inputs[i]),
              CollectiveOptions().process_set(set_),
              false,
              outputs[i].is_contiguous() ? outputs[i] : at::Tensor()));
        }
        return *handles;
      },
      [outputs, handles] {
        for (size_t i = 0; i < outputs.size(); ++i)
          copy_into(outputs[i], (*handles)[i].result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::barrier(
    const ::c10d::BarrierOptions& opts) {
  return RONDE_LAUNCH(BARRIER, "barrier", {}, [&] {
    return std::vector<Handle>{
        ronde::detail::barrier_call(set_, !opts.asyncOp)};
  });
}

void Backend::monitoredBarrier(
    const ::c10d::BarrierOptions& /*opts*/, bool /*wait_all_ranks*/) {
  // ronde's barrier already names the ranks that did not come (the
  // failure notices), within ronde's timeout.
  ronde::detail::barrier_call(set_, true).wait();
}

c10::intrusive_ptr<::c10d::Work> Backend::send(
    std::vector<at::Tensor>& tensors, int dst, int tag) {
  return RONDE_LAUNCH(SEND, "send", tensors, [&] {
    return std::vector<Handle>{
        p2p_->post(one(tensors, "send"), rank_, dst, tag, /*sending=*/true)};
  });
}

c10::intrusive_ptr<::c10d::Work> Backend::recv(
    std::vector<at::Tensor>& tensors, int src, int tag) {
  return RONDE_LAUNCH(RECV, "recv", tensors, [&] {
    return std::vector<Handle>{
        p2p_->post(one(tensors, "recv"), src, rank_, tag, /*sending=*/false)};
  });
}

c10::intrusive_ptr<::c10d::Work> Backend::recvAnysource(
    std::vector<at::Tensor>& /*tensors*/, int /*tag*/) {
  // The senders learn it too (c10d/p2p.h): a send meant for this receive
  // would otherwise wait for the group's timeout.
  p2p_->refuse_any_source();
  TORCH_CHECK(
      false,
      "ronde: recv without a source rank on rank ",
      rank_,
      " is not "
      "supported: ronde matches messages per pair of ranks; name the sender "
      "(dist.recv(t, src=...)). The sends to this rank that wait fail too");
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
