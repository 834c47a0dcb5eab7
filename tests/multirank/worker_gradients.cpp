// Scenario gradients: backward through each blocking collective, against
// Horovod's rules computed here from every rank's inputs and upstream
// gradients (each rank can make any rank's, input_for is deterministic).
// Rank k's loss is sum(w_k * y_k), so the gradient arriving at its output
// is w_k.
#include <ronde/collectives.h>
#include <ronde/runtime.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_reference.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace ronde::testing;

// x: this rank's input, requiring a gradient; fn: the collective; w: the
// upstream gradient on rank k. Returns x.grad.
at::Tensor grad_through(
    const at::Tensor& x,
    const std::function<at::Tensor(const at::Tensor&)>& fn,
    const at::Tensor& w) {
  at::Tensor leaf = x.detach().clone().requires_grad_(true);
  at::Tensor y = fn(leaf);
  CHECK_W(y.requires_grad(), "the output carries no grad_fn");
  (y * w).sum().backward();
  return leaf.grad();
}

at::Tensor weights(int k, int64_t seed, at::IntArrayRef shape) {
  return input_for(k, seed + 1000, shape, at::kDouble);
}

// sum over k of w_k
at::Tensor summed_weights(int n, int64_t seed, at::IntArrayRef shape) {
  at::Tensor s = at::zeros(shape, at::kDouble);
  for (int k = 0; k < n; ++k)
    s += weights(k, seed, shape);
  return s;
}

void check_gradients() {
  const int n = ronde::size();
  const int me = ronde::rank();
  const std::vector<int64_t> shape{3, 4};
  const at::Tensor x = input_for(me, 1, shape, at::kDouble);
  const at::Tensor w_sum = summed_weights(n, 1, shape);
  using ronde::ReduceOp;

  at::Tensor g = grad_through(
      x,
      [](const at::Tensor& t) {
        return ronde::allreduce(t, ronde::AllreduceOptions().op(ReduceOp::Sum));
      },
      weights(me, 1, shape));
  CHECK_W(close(g, w_sum), "allreduce Sum");

  g = grad_through(
      x,
      [](const at::Tensor& t) {
        return ronde::allreduce(
            t,
            ronde::AllreduceOptions()
                .op(ReduceOp::Average)
                .prescale_factor(2.0));
      },
      weights(me, 1, shape));
  CHECK_W(close(g, w_sum * 2.0 / n), "allreduce Average, prescale 2");

  at::Tensor y_prod;
  g = grad_through(
      x,
      [&](const at::Tensor& t) {
        y_prod = ronde::allreduce(
            t, ronde::AllreduceOptions().op(ReduceOp::Product));
        return y_prod;
      },
      weights(me, 1, shape));
  CHECK_W(close(g, w_sum * y_prod.detach() / x), "allreduce Product");

  const int root = n - 1;
  g = grad_through(
      x,
      [&](const at::Tensor& t) { return ronde::broadcast(t, root); },
      weights(me, 1, shape));
  CHECK_W(
      close(g, me == root ? w_sum / n : at::zeros_like(w_sum)), "broadcast");

  // allgather: rank r has r + 1 rows; this rank's rows start at the sum of
  // the rows before it.
  const int64_t total = n * (n + 1) / 2;
  const at::Tensor xg = input_for(me, 2, {me + 1, 2}, at::kDouble);
  g = grad_through(
      xg,
      [](const at::Tensor& t) { return ronde::allgather(t); },
      weights(me, 2, {total, 2}));
  CHECK_W(
      close(
          g,
          summed_weights(n, 2, {total, 2})
                  .narrow(0, me * (me + 1) / 2, me + 1) /
              n),
      "allgather");

  // alltoall and reducescatter: two rows per rank; block j goes to rank j.
  const at::Tensor xb = input_for(me, 3, {2 * n, 2}, at::kDouble);
  g = grad_through(
      xb,
      [](const at::Tensor& t) { return ronde::alltoall(t); },
      weights(me, 3, {2 * n, 2}));
  std::vector<at::Tensor> blocks;
  for (int j = 0; j < n; ++j)
    blocks.push_back(weights(j, 3, {2 * n, 2}).narrow(0, 2 * me, 2));
  CHECK_W(close(g, at::cat(blocks)), "alltoall");

  g = grad_through(
      xb,
      [](const at::Tensor& t) {
        return ronde::reducescatter(
            t, ronde::ReducescatterOptions().op(ReduceOp::Sum));
      },
      weights(me, 4, {2, 2}));
  blocks.clear();
  for (int j = 0; j < n; ++j)
    blocks.push_back(weights(j, 4, {2, 2}) * n);
  CHECK_W(close(g, at::cat(blocks)), "reducescatter Sum");

  // No gradient: a clear error, not a wrong one.
  expect_error(
      [&] {
        ronde::allreduce(
            x.detach().clone().requires_grad_(true),
            ronde::AllreduceOptions().op(ReduceOp::Max));
      },
      {"allreduce with op max has no gradient", "rank"});
  // Outside autograd: the asynchronous forms' outputs require nothing.
  at::Tensor leaf = x.detach().clone().requires_grad_(true);
  CHECK_W(!ronde::allreduce_async(leaf).result().requires_grad(), "async");
  {
    at::NoGradGuard no_grad;
    CHECK_W(!ronde::allreduce(leaf).requires_grad(), "no_grad");
  }
}

RONDE_SCENARIO(gradients) {
  ronde::init();
  check_gradients();
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

}  // namespace
