// Scenarios of uneven inputs: ranks that run out of data call join(), the
// others train on (join, in several variants), and a rank that dies while
// the others wait in join() (join_killed).
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_optim_common.h"

#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace ronde::testing;

// Uneven inputs: rank r has kJoinBatches[r] steps of data (10, 7, 3, 5)
// and then calls ronde::join(). The last to join (rank 0) must end where
// one process ends that trains on the same batches in the same order, each
// step averaging over the ranks that still had data (variant "setsize":
// dividing by the set's size); "bpps2": two backward passes per step;
// "set": everything on a process set of every rank; "amp": rank 0's loss
// overflows at step 5, after rank 2 joined, and the step is skipped.
constexpr int kJoinBatches[] = {10, 7, 3, 5};

int scenario_join(const std::string& variant) {
  ronde::init();
  const int n = ronde::size(), me = ronde::rank();
  ronde::ProcessSet set;
  if (variant == "set") {
    std::vector<int> all;
    for (int q = n - 1; q >= 0; --q)
      all.push_back(q);
    set = ronde::add_process_set(all);
  }
  const bool by_set = variant == "setsize";
  const bool amp = variant == "amp";
  const int64_t k = variant == "bpps2" ? 2 : 1;
  const int64_t rows = 4;
  const int bad_step = 5;
  int steps = 0;
  for (int q = 0; q < n; ++q)
    steps = std::max(steps, kJoinBatches[q]);
  torch::manual_seed(21);
  torch::Tensor X = torch::randn({steps, k, n, rows, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({steps, k, n, rows, 4}, torch::kDouble);
  auto active_at = [&](int s) {
    std::vector<int> a;
    for (int q = 0; q < n; ++q) {
      if (s < kJoinBatches[q])
        a.push_back(q);
    }
    return a;
  };

  Net ref = make_net(true);
  auto ref_opt = make_optimizer("sgd", ref, false);
  for (int s = 0; s < steps; ++s) {
    const std::vector<int> a = active_at(s);
    if (amp && s == bad_step)
      continue;  // every rank skips it
    ref_opt->zero_grad();
    torch::Tensor loss = torch::zeros({}, torch::kDouble);
    for (int64_t j = 0; j < k; ++j) {
      for (int q : a)
        loss = loss + torch::mse_loss(ref->forward(X[s][j][q]), Y[s][j][q]);
    }
    (loss / (static_cast<double>(by_set ? n : a.size()) * k)).backward();
    ref_opt->step();
  }

  Net net = make_net(true);
  ronde::broadcast_parameters(net->named_parameters(), 0, set);
  auto base = make_optimizer("sgd", net, false);
  ronde::DistributedOptimizer opt(
      base,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions()
          .process_set(set)
          .backward_passes_per_step(k)
          .divide_by_set_size(by_set)
          .fusion_threshold_mb(0.001)
          .first_bucket_mb(0.0005));
  ronde::GradScaler scaler(ronde::GradScalerOptions().init_scale(1024));
  for (int s = 0; s < kJoinBatches[me]; ++s) {
    const std::vector<int> a = active_at(s);
    // Another collective each step, which joined ranks answer with zeros:
    // the sum of the active ranks' losses (their replicas are equal).
    double want = 0;
    {
      torch::NoGradGuard g;
      for (int q : a)
        want += torch::mse_loss(net->forward(X[s][0][q]), Y[s][0][q])
                    .item<double>();
    }
    opt.zero_grad();
    for (int64_t j = 0; j < k; ++j) {
      auto loss = torch::mse_loss(net->forward(X[s][j][me]), Y[s][j][me]);
      if (j == 0) {
        at::Tensor sum = ronde::allreduce(
            loss.detach().reshape({1}),
            ronde::AllreduceOptions()
                .op(ronde::ReduceOp::Sum)
                .name("loss")
                .process_set(set));
        CHECK_W(
            std::abs(sum.item<double>() - want) < 1e-9 * (1 + want),
            "step ",
            s,
            ": the loss sum over the active ranks is ",
            sum.item<double>(),
            ", expected ",
            want);
      }
      if (amp) {
        if (s == bad_step && me == 0)
          loss = loss * std::numeric_limits<double>::infinity();
        scaler.scale(loss).backward();
      } else {
        loss.backward();
      }
    }
    if (amp) {
      const bool stepped = scaler.step(opt);
      scaler.update();
      CHECK_W(stepped == (s != bad_step), "step ", s, " stepped=", stepped);
    } else {
      opt.step();
    }
  }
  const int last = ronde::join(set);
  CHECK_W(last == 0, "join() returned ", last, ", expected rank 0");
  ronde::broadcast_parameters(net->named_parameters(), last, set);
  auto mine = params_flat(*net);
  auto want = params_flat(*ref);
  CHECK_W(
      torch::allclose(mine, want, 1e-7, 1e-10),
      "join/",
      variant,
      " differs from the single-process reference: max abs diff ",
      (mine - want).abs().max().item<double>());
  // A second join by every rank at once: the highest rank counts as last,
  // and the job goes on.
  const int again = ronde::join(set);
  CHECK_W(again == n - 1, "second join() returned ", again);
  at::Tensor one = ronde::allreduce(
      torch::ones({1}),
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).process_set(set));
  CHECK_W(one.item<float>() == n, "allreduce after join");
  // A joined rank cannot be a broadcast's root: every rank fails alike.
  if (me == n - 1) {
    expect_error(
        [&] { ronde::join(set); },
        {"broadcast 'from_joined' from rank " + std::to_string(n - 1),
         "in ronde::join()"});
  } else {
    expect_error(
        [&] {
          ronde::broadcast(
              torch::ones({2}),
              n - 1,
              ronde::CollectiveOptions().name("from_joined").process_set(set));
        },
        {"broadcast 'from_joined' from rank " + std::to_string(n - 1),
         "in ronde::join()"});
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

RONDE_SCENARIO(join) {
  return scenario_join(argc > 2 ? argv[2] : "contrib");
}

// Ranks 0 and 1 run out of data and wait in join() while the last rank
// trains on, then dies: they fail with a CommError, within the timeout.
RONDE_SCENARIO(join_killed) {
  ronde::init();
  const int n = ronde::size(), me = ronde::rank();
  Net net = make_net(true);
  ronde::DistributedOptimizer opt(
      make_optimizer("sgd", net, false), net->named_parameters());
  torch::manual_seed(3);
  torch::Tensor X = torch::randn({4, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({4, 4}, torch::kDouble);
  const int mine = me == n - 1 ? 6 : 2;
  for (int s = 0; s < mine; ++s) {
    if (me == n - 1 && s == 4)
      ::kill(::getpid(), SIGKILL);
    opt.zero_grad();
    torch::mse_loss(net->forward(X), Y).backward();
    opt.step();
  }
  try {
    ronde::join();
    std::cout << "NO_ERROR" << std::endl;
    return 1;
  } catch (const ronde::CommError& e) {
    ronde::testing::print_comm_error(e);
    return 3;
  }
}

}  // namespace
