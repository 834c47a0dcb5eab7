// Horovod's backward rules for the blocking collectives (see autograd.h).
// For allreduce and alltoall they give the gradient of the sum of the
// ranks' losses; broadcast and allgather average where that sum adds, and
// reducescatter scales by the set's size:
//  - allreduce (Sum, Average, pre- and postscale): the same all-reduce of
//    the output's gradients; Product: the summed gradients times the
//    product over this rank's input; Min and Max have no gradient, and an
//    input that requires one is refused;
//  - broadcast: the averaged gradients on the root, zero elsewhere;
//  - allgather: the averaged gradients of this rank's rows;
//  - alltoall: an alltoall of the gradients back along the received splits;
//  - reducescatter (Sum, Average): an allgather of the parts' gradients,
//    times the set's size for Sum and the pre- and postscale factors.
// Each forward runs the plain collective without grad mode and hangs a
// Node on its output; the Node's collectives run when backward reaches it,
// so every rank must backpropagate through the same collectives in the
// same order, as it ran them forward.
#include "comm/autograd.h"

#include <ronde/process_set.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <string>
#include <utility>
#include <vector>

namespace ronde::detail {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// The gradients' sum over the set divided by its size (not by the ranks
// outside a join).
at::Tensor averaged(const at::Tensor& grad, const ProcessSet& set) {
  return ronde::allreduce(
             grad, AllreduceOptions().op(ReduceOp::Sum).process_set(set))
      .div_(set.size());
}

// The collective itself, recording no gradient (its Node is hung by hand;
// with grad mode on, the call would come back here).
template <typename Collective>
at::Tensor without_grad(Collective&& collective) {
  at::NoGradGuard no_grad;
  return collective();
}

// Hangs `fn` on `out` as the gradient function of a collective on `in`.
at::Tensor attach(
    at::Tensor out, const at::Tensor& in, c10::intrusive_ptr<Node> fn) {
  fn->set_next_edges(torch::autograd::collect_next_edges(in));
  torch::autograd::set_history(out, fn);
  return out;
}

void refuse_no_gradient(ReduceOp op, const char* what) {
  TORCH_CHECK(
      op == ReduceOp::Sum || op == ReduceOp::Average ||
          (op == ReduceOp::Product && std::string(what) == "allreduce"),
      "ronde: ",
      what,
      " with op ",
      to_string(op),
      " has no gradient, and the input requires one (rank ",
      ronde::rank(),
      "): detach the input, or reduce with Sum or Average");
}

// The backward of a collective of one input: undefined where the output's
// gradient is (the output went unused), else backward(grad).
struct CollectiveBackward : Node {
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined())
      return {at::Tensor()};
    return {backward(grads[0].contiguous())};
  }
  virtual at::Tensor backward(const at::Tensor& grad) = 0;
};

struct AllreduceBackward : CollectiveBackward {
  AllreduceOptions options;
  at::Tensor input, output;  // detached; Product only

  std::string name() const override {
    return "ronde::AllreduceBackward";
  }
  at::Tensor backward(const at::Tensor& grad) override {
    if (options.op() == ReduceOp::Product) {
      const at::Tensor sum = ronde::allreduce(
          grad,
          AllreduceOptions()
              .op(ReduceOp::Sum)
              .process_set(options.process_set()));
      return sum * output / input;
    }
    return ronde::allreduce(grad, options);
  }
};

struct BroadcastBackward : CollectiveBackward {
  int root = 0;
  ProcessSet set;

  std::string name() const override {
    return "ronde::BroadcastBackward";
  }
  at::Tensor backward(const at::Tensor& grad) override {
    at::Tensor g = averaged(grad, set);
    return set.rank() == root ? g : at::zeros_like(g);
  }
};

struct AllgatherBackward : CollectiveBackward {
  ProcessSet set;
  std::vector<int64_t> shape;

  std::string name() const override {
    return "ronde::AllgatherBackward";
  }
  at::Tensor backward(const at::Tensor& grad) override {
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const at::Tensor all = ronde::allgather(
        at::full({1}, rows, at::kLong), CollectiveOptions().process_set(set));
    const int64_t offset = all.narrow(0, 0, set.rank()).sum().item<int64_t>();
    return averaged(grad, set).narrow(0, offset, rows).reshape(shape);
  }
};

struct AlltoallBackward : CollectiveBackward {
  ProcessSet set;
  std::vector<int64_t> received;

  std::string name() const override {
    return "ronde::AlltoallBackward";
  }
  at::Tensor backward(const at::Tensor& grad) override {
    return ronde::alltoall(
        grad, AlltoallOptions().splits(received).process_set(set));
  }
};

struct ReducescatterBackward : CollectiveBackward {
  ProcessSet set;
  double scale = 1.0;

  std::string name() const override {
    return "ronde::ReducescatterBackward";
  }
  at::Tensor backward(const at::Tensor& grad) override {
    at::Tensor g = ronde::allgather(grad, CollectiveOptions().process_set(set));
    return scale == 1.0 ? g : g * scale;
  }
};

}  // namespace

at::Tensor allreduce_with_grad(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  refuse_no_gradient(options.op(), "allreduce");
  at::Tensor out =
      without_grad([&] { return ronde::allreduce(tensor, options); });
  auto node = c10::make_intrusive<AllreduceBackward>();
  node->options = options;
  node->options.name("");
  if (options.op() == ReduceOp::Product) {
    node->input = tensor.detach();
    node->output = out.detach();
  }
  return attach(out, tensor, node);
}

at::Tensor broadcast_with_grad(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  at::Tensor out = without_grad(
      [&] { return ronde::broadcast(tensor, root_rank, options); });
  auto node = c10::make_intrusive<BroadcastBackward>();
  node->root = root_rank;
  node->set = options.process_set();
  return attach(out, tensor, node);
}

at::Tensor allgather_with_grad(
    const at::Tensor& tensor, const CollectiveOptions& options) {
  at::Tensor out =
      without_grad([&] { return ronde::allgather(tensor, options); });
  auto node = c10::make_intrusive<AllgatherBackward>();
  node->set = options.process_set();
  node->shape = tensor.sizes().vec();
  return attach(out, tensor, node);
}

at::Tensor alltoall_with_grad(
    const at::Tensor& tensor, const AlltoallOptions& options) {
  // The asynchronous form records no gradient and gives the splits.
  const Handle handle = ronde::alltoall_async(tensor, options);
  auto node = c10::make_intrusive<AlltoallBackward>();
  node->set = options.process_set();
  node->received = handle.received_splits();
  return attach(handle.result(), tensor, node);
}

at::Tensor reducescatter_with_grad(
    const at::Tensor& tensor, const ReducescatterOptions& options) {
  refuse_no_gradient(options.op(), "reducescatter");
  at::Tensor out =
      without_grad([&] { return ronde::reducescatter(tensor, options); });
  auto node = c10::make_intrusive<ReducescatterBackward>();
  node->set = options.process_set();
  node->scale =
      options.prescale_factor() * options.postscale_factor() *
      (options.op() == ReduceOp::Sum ? options.process_set().size() : 1);
  return attach(out, tensor, node);
}

}  // namespace ronde::detail
