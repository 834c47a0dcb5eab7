// Scenarios of the communication hooks (ronde/comm_hook.h): the built-in
// all-reduce and 16-bit hooks against collectives made by hand, PowerSGD's
// replicas, its step against a reference in plain tensor operations, its
// resume from a checkpoint, with joined ranks, the example's own hook, and
// bad options.
#include <ronde/ronde.h>

#include "common/scaled_fp16_hook.h"
#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_optim_common.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace ronde::testing;

// Rank `q`'s batch at step `s`, alike wherever it is drawn.
std::pair<torch::Tensor, torch::Tensor> batch_of(int q, int s) {
  torch::manual_seed(1000 + 31 * s + q);
  return {
      torch::randn({6, 8}, torch::kDouble),
      torch::randn({6, 4}, torch::kDouble)};
}

// The gradient rank `q` computes at step `s` of `net` (no reduction).
std::vector<torch::Tensor> local_grads(Net& net, int q, int s) {
  auto [x, y] = batch_of(q, s);
  std::vector<torch::Tensor> params;
  for (auto& p : net->parameters())
    params.push_back(p);
  auto loss = torch::mse_loss(net->forward(x), y);
  return torch::autograd::grad({loss}, params, {}, false, false, true);
}

// Step `s`'s backward on this rank's batch and opt.synchronize(): every
// gradient equal to `want`'s, bit for bit, else a failure naming `what`.
void check_synchronized(
    Net& net,
    ronde::DistributedOptimizer& opt,
    int s,
    const std::vector<torch::Tensor>& want,
    const std::string& what) {
  auto [x, y] = batch_of(ronde::rank(), s);
  opt.zero_grad();
  torch::mse_loss(net->forward(x), y).backward();
  opt.synchronize();
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK_W(
        torch::equal(params[i].grad(), want[i]),
        what,
        ": gradient ",
        i,
        " differs from the hand-made all-reduce");
  }
}

// Step `s` of this rank's training; with `zero_loss`, the same batch's
// loss times 0 (zero gradients, and a step like every rank's).
void step_on(
    Net& net, ronde::DistributedOptimizer& opt, int s, bool zero_loss = false) {
  auto [x, y] = batch_of(ronde::rank(), s);
  opt.zero_grad();
  auto loss = torch::mse_loss(net->forward(x), y);
  (zero_loss ? loss * 0 : loss).backward();
  opt.step();
}

// `steps` steps of SGD on rank r's batches, with `options`; returns the
// optimizer for the caller's looks.
std::unique_ptr<ronde::DistributedOptimizer> train(
    Net& net,
    const ronde::DistributedOptimizerOptions& options,
    int steps,
    int first_step = 0,
    bool check_each = false) {
  auto base = std::make_shared<torch::optim::SGD>(
      net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto opt = std::make_unique<ronde::DistributedOptimizer>(
      base, net->named_parameters(), options);
  for (int s = first_step; s < first_step + steps; ++s) {
    step_on(net, *opt, s);
    if (check_each)
      check_replicas_identical(params_flat(*net));
  }
  return opt;
}

// The all-reduce hook is the all-reduce of each gradient, and the 16-bit
// hooks the all-reduce of each gradient cast, bit for bit; bad options and
// misuse get clear errors.
RONDE_SCENARIO(hook_builtins) {
  ronde::init();
  const int r = ronde::rank();
  struct Case {
    std::shared_ptr<ronde::CommHook> hook;
    std::optional<at::ScalarType> wire;
  };
  for (const Case& c :
       {Case{ronde::allreduce_hook(), std::nullopt},
        Case{ronde::fp16_compress_hook(), at::kHalf},
        Case{ronde::bf16_compress_hook(), at::kBFloat16}}) {
    Net net = make_net(true);
    auto want = local_grads(net, r, 0);
    for (auto& g : want) {
      g = c.wire ? ronde::allreduce(g.to(*c.wire)).to(torch::kDouble)
                 : ronde::allreduce(g);
    }
    auto base = std::make_shared<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.1));
    ronde::DistributedOptimizer opt(
        base,
        net->named_parameters(),
        ronde::DistributedOptimizerOptions().comm_hook(c.hook));
    check_synchronized(net, opt, 0, want, c.hook->name());
    const int64_t bytes = c.wire ? 2 : 8;
    CHECK_W(c.hook->buckets_reduced() >= 1, c.hook->name(), " reduced none");
    CHECK_W(
        c.hook->bytes_sent() >= bytes * net->parameters().size(),
        c.hook->name(),
        " counted ",
        c.hook->bytes_sent());
    opt.skip_step();
  }
  Net net = make_net(true);
  auto base = std::make_shared<torch::optim::SGD>(
      net->parameters(), torch::optim::SGDOptions(0.1));
  expect_error(
      [] { ronde::powersgd_hook(ronde::PowerSGDOptions().rank(0)); },
      {"PowerSGD on rank", "rank must be at least 1, got 0"});
  expect_error(
      [] { ronde::powersgd_hook(ronde::PowerSGDOptions().start_iter(-1)); },
      {"start_iter must be >= 0, got -1"});
  expect_error(
      [] {
        ronde::powersgd_hook(ronde::PowerSGDOptions().min_compression_rate(0));
      },
      {"min_compression_rate must be positive"});
  expect_error(
      [&] {
        ronde::DistributedOptimizer(
            base,
            net->named_parameters(),
            ronde::DistributedOptimizerOptions()
                .comm_hook(ronde::powersgd_hook())
                .compression(ronde::Compression::FP16));
      },
      {"both compression and comm_hook are set"});
  expect_error(
      [&] {
        ronde::DistributedOptimizer(
            base,
            net->named_parameters(),
            ronde::DistributedOptimizerOptions()
                .comm_hook(ronde::powersgd_hook())
                .shard_optimizer_state(true));
      },
      {"sharded optimizer", "takes no comm_hook", "powersgd"});
  // Ranks that chose different hooks fail together, naming both.
  expect_error(
      [&] {
        ronde::DistributedOptimizer(
            base,
            net->named_parameters(),
            ronde::DistributedOptimizerOptions().comm_hook(
                ronde::powersgd_hook(ronde::PowerSGDOptions().rank(1 + r))));
      },
      {"DistributedOptimizer comm_hook: ranks disagree", "powersgd"});
  auto shared = ronde::powersgd_hook();
  ronde::DistributedOptimizer first(
      base,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions().comm_hook(shared));
  Net other = make_net(true);
  auto base2 = std::make_shared<torch::optim::SGD>(
      other->parameters(), torch::optim::SGDOptions(0.1));
  expect_error(
      [&] {
        ronde::DistributedOptimizer(
            base2,
            other->named_parameters(),
            ronde::DistributedOptimizerOptions().comm_hook(shared));
      },
      {"already serves another optimizer"});
  ronde::shutdown();
  return scenario_exit_code();
}

// The 16-bit hooks over several steps of one bucket per gradient, each
// cast into the hook's kept wire buffer (grown to the largest, a prefix of
// it for the others), there in the shared-memory arena (every size is
// read in place): every step's gradients equal the all-reduce of each
// gradient cast, made by hand, bit for bit.
RONDE_SCENARIO(hook_cast_steps) {
  ::setenv("RONDE_SHM_ZERO_COPY_BYTES", "0", 1);
  ronde::init();
  const int r = ronde::rank();
  for (const at::ScalarType wire : {at::kHalf, at::kBFloat16}) {
    Net net = make_net(true);
    auto base = std::make_shared<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.1));
    auto hook = wire == at::kHalf ? ronde::fp16_compress_hook()
                                  : ronde::bf16_compress_hook();
    ronde::DistributedOptimizer opt(
        base,
        net->named_parameters(),
        ronde::DistributedOptimizerOptions()
            .comm_hook(hook)
            // A bucket closes once it holds its cap: one per gradient.
            .fusion_threshold_mb(0.000001)
            .first_bucket_mb(0.000001));
    for (int s = 0; s < 3; ++s) {
      auto want = local_grads(net, r, s);
      for (auto& g : want)
        g = ronde::allreduce(g.to(wire)).to(torch::kDouble);
      check_synchronized(
          net, opt, s, want, hook->name() + " step " + std::to_string(s));
      opt.step();
    }
    CHECK_W(
        opt.buckets().size() == net->parameters().size(),
        "expected one bucket per gradient, got ",
        opt.buckets().size());
  }
  ronde::shutdown();
  return scenario_exit_code();
}

// PowerSGD: replicas bitwise equal after every step, fewer bytes than the
// all-reduce, and with start_iter beyond the run, plain training exactly.
RONDE_SCENARIO(powersgd_train) {
  ronde::init();
  const int steps = 6;
  Net plain = make_net(false);
  auto plain_opt = train(plain, {}, steps);
  const int64_t plain_bytes = plain_opt->comm_hook()->bytes_sent();

  Net late = make_net(false);
  train(
      late,
      ronde::DistributedOptimizerOptions().comm_hook(ronde::powersgd_hook(
          ronde::PowerSGDOptions().rank(2).start_iter(steps + 100))),
      steps);
  CHECK_W(
      torch::equal(params_flat(*late), params_flat(*plain)),
      "PowerSGD before start_iter is not plain training");

  for (bool warm : {true, false}) {
    Net net = make_net(false);
    auto hook = ronde::powersgd_hook(
        ronde::PowerSGDOptions().rank(2).start_iter(1).warm_start(warm));
    train(
        net,
        ronde::DistributedOptimizerOptions().comm_hook(hook),
        steps,
        0,
        /*check_each=*/true);
    CHECK_W(
        hook->bytes_sent() < plain_bytes,
        "PowerSGD sent ",
        hook->bytes_sent(),
        " bytes, the all-reduce ",
        plain_bytes);
    const double moved =
        (params_flat(*net) - params_flat(*plain)).abs().max().item<double>();
    CHECK_W(moved > 0, "PowerSGD changed nothing: not compressing?");
    CHECK_W(std::isfinite(moved), "PowerSGD parameters not finite");
    if (ronde::rank() == 0) {
      std::cout << "powersgd warm_start=" << warm << " bytes "
                << hook->bytes_sent() << " of " << plain_bytes
                << ", max distance to plain " << moved << std::endl;
    }
  }
  ronde::shutdown();
  return scenario_exit_code();
}

// The hook's state (CommHook::save), readable.
torch::serialize::InputArchive state_of(const ronde::CommHook& hook) {
  torch::serialize::OutputArchive out;
  hook.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream stream(bytes.str());
  in.load_from(stream);
  return in;
}

torch::Tensor read(torch::serialize::InputArchive& a, const std::string& k) {
  torch::Tensor t;
  a.read(k, t);
  return t;
}

bool close(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::allclose(a, b, 1e-9, 1e-12);
}

// One PowerSGD step against PowerSGD in plain tensor operations: every
// rank's gradient plus its error, P averaged and orthonormalized (by QR
// here, Gram-Schmidt in ronde), Q averaged, P Q^T; the new Q and each
// rank's new error too. The parameters stay (LR 0), so every rank's
// gradient is known here.
RONDE_SCENARIO(powersgd_reference) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  Net net = make_net(true);
  auto hook =
      ronde::powersgd_hook(ronde::PowerSGDOptions().rank(2).start_iter(0));
  auto base = std::make_shared<torch::optim::SGD>(
      net->parameters(), torch::optim::SGDOptions(0));
  ronde::DistributedOptimizer opt(
      base,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions().comm_hook(hook));
  step_on(net, opt, 0);
  auto before = state_of(*hook);
  // fc1, fc2 and extra compress; fc3 (4 x 16 at rank 2) would not gain 2x.
  const std::vector<int64_t> compressed = {0, 2, 4};
  CHECK_W(
      torch::equal(read(before, "q"), torch::tensor(compressed)),
      "compressed ",
      read(before, "q"));
  std::vector<torch::Tensor> q1, errors;  // errors[i]: [rank, n, m]
  for (int64_t p : compressed) {
    q1.push_back(read(before, "q_" + std::to_string(p)));
    errors.push_back(ronde::allgather(
        read(before, "error_" + std::to_string(p)).unsqueeze(0)));
  }
  std::vector<std::vector<torch::Tensor>> grads;  // by rank
  for (int q = 0; q < n; ++q)
    grads.push_back(local_grads(net, q, 1));
  step_on(net, opt, 1);
  auto after = state_of(*hook);
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = std::find(compressed.begin(), compressed.end(), i);
    if (it == compressed.end()) {
      torch::Tensor mean = torch::zeros_like(grads[0][i]);
      for (int q = 0; q < n; ++q)
        mean += grads[q][i];
      CHECK_W(close(params[i].grad(), mean / n), "plain gradient ", i);
      continue;
    }
    const size_t k = it - compressed.begin();
    std::vector<torch::Tensor> m;
    torch::Tensor p = torch::zeros({grads[0][i].size(0), 2}, torch::kDouble);
    for (int q = 0; q < n; ++q) {
      m.push_back(grads[q][i] + errors[k][q]);
      p += torch::mm(m[q], q1[k]) / n;
    }
    auto [qr, rr] = torch::linalg_qr(p);
    p = qr * torch::sign(torch::diagonal(rr)).unsqueeze(0);
    torch::Tensor qmat = torch::zeros_like(q1[k]);
    for (int q = 0; q < n; ++q)
      qmat += torch::mm(m[q].t(), p) / n;
    torch::Tensor approx = torch::mm(p, qmat.t());
    const std::string key = std::to_string(i);
    CHECK_W(close(params[i].grad(), approx), "PowerSGD gradient ", key);
    CHECK_W(close(read(after, "q_" + key), qmat), "PowerSGD Q ", key);
    CHECK_W(
        close(read(after, "error_" + key), m[r] - approx),
        "PowerSGD error ",
        key);
  }
  ronde::shutdown();
  return scenario_exit_code();
}

// A run resumed from a checkpoint of PowerSGD's state (Q, every rank's
// error buffer, the step count) goes on exactly as the uninterrupted one.
RONDE_SCENARIO(powersgd_resume) {
  if (argc != 3) {
    std::cerr << "usage: worker powersgd_resume DIR" << std::endl;
    return 2;
  }
  ronde::init();
  const std::string dir = argv[2];
  auto options = [] {
    return ronde::DistributedOptimizerOptions().comm_hook(
        ronde::powersgd_hook(ronde::PowerSGDOptions().rank(1).start_iter(2)));
  };
  const int total = 8, cut = 4;
  Net straight = make_net(false);
  train(straight, options(), total);
  {
    Net first = make_net(false);
    auto opt = train(first, options(), cut);
    ronde::Checkpointer ckpt(dir, 0);
    ckpt.add("model", *first).add("optimizer", *opt);
    ckpt.save(cut);
  }
  Net resumed = make_net(false);
  auto opt = train(resumed, options(), 0);
  ronde::Checkpointer ckpt(dir, 0);
  ckpt.add("model", *resumed).add("optimizer", *opt);
  CHECK_W(ckpt.restore() == cut, "no checkpoint restored");
  for (int s = cut; s < total; ++s)
    step_on(resumed, *opt, s);
  CHECK_W(
      torch::equal(params_flat(*resumed), params_flat(*straight)),
      "the resumed run differs from the uninterrupted one by ",
      (params_flat(*resumed) - params_flat(*straight)).abs().max());
  ronde::shutdown();
  return scenario_exit_code();
}

// PowerSGD with uneven inputs: rank r has kJoinSteps[r] steps and then
// joins, answering both of each bucket's all-reduces with zeros. Without
// error feedback and dividing by the set's size, that is what a rank whose
// gradients are zero sends, so rank 0, the last to join, must end where it
// ends when every rank steps to the end, the joined ones with zero losses.
constexpr int kJoinSteps[] = {6, 3, 2, 4};

RONDE_SCENARIO(powersgd_join) {
  ronde::init();
  const int me = ronde::rank();
  // A fresh hook for each optimizer: one hook serves one at a time.
  auto options = [] {
    return ronde::DistributedOptimizerOptions()
        .divide_by_set_size(true)
        .fusion_threshold_mb(0.001)
        .comm_hook(ronde::powersgd_hook(
            ronde::PowerSGDOptions().rank(2).start_iter(1).error_feedback(
                false)));
  };
  Net zeros = make_net(false);
  auto zeros_opt = train(zeros, options(), 0);
  for (int s = 0; s < kJoinSteps[0]; ++s)
    step_on(zeros, *zeros_opt, s, /*zero_loss=*/s >= kJoinSteps[me]);
  Net joined = make_net(false);
  auto joined_opt = train(joined, options(), kJoinSteps[me]);
  const int last = ronde::join();
  CHECK_W(last == 0, "join() returned ", last, ", expected rank 0");
  if (me == 0) {
    const torch::Tensor a = params_flat(*joined), b = params_flat(*zeros);
    CHECK_W(
        torch::allclose(a, b, 1e-12, 1e-14),
        "PowerSGD with joined ranks differs from zero gradients by ",
        (a - b).abs().max());
    CHECK_W(!torch::equal(a, params_flat(*make_net(false))), "nothing trained");
  }
  ronde::shutdown();
  return scenario_exit_code();
}

// The example's own hook (examples/common/scaled_fp16_hook.h) keeps tiny
// gradients within float16's rounding where the plain fp16 hook flushes
// them.
RONDE_SCENARIO(user_hook) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  double errors[2];
  for (int k = 0; k < 2; ++k) {
    std::shared_ptr<ronde::CommHook> hook =
        k == 0 ? std::shared_ptr<ronde::CommHook>(
                     std::make_shared<examples::ScaledFp16Hook>())
               : ronde::fp16_compress_hook();
    Net net = make_net(true);
    torch::Tensor exact;
    for (int q = 0; q < n; ++q) {
      auto g = local_grads(net, q, 0)[0] * 1e-7;
      exact = q == 0 ? g / n : exact + g / n;
    }
    auto base = std::make_shared<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.1));
    ronde::DistributedOptimizer opt(
        base,
        net->named_parameters(),
        ronde::DistributedOptimizerOptions().comm_hook(hook));
    auto [x, y] = batch_of(r, 0);
    opt.zero_grad();
    (torch::mse_loss(net->forward(x), y) * 1e-7).backward();
    opt.step();
    const torch::Tensor got = net->fc1->weight.grad();
    errors[k] = ((got - exact).abs().max() / exact.abs().max()).item<double>();
    check_replicas_identical(params_flat(*net));
    CHECK_W(hook->bytes_sent() > 0, hook->name(), " counted no bytes");
  }
  // One rounding per rank and one on the way back (see "compression").
  CHECK_W(
      errors[0] <= (n + 2) * std::pow(2, -11), "scaled fp16 error ", errors[0]);
  CHECK_W(
      errors[1] > 10 * errors[0],
      "plain fp16 error ",
      errors[1],
      " not above the scaled ",
      errors[0]);
  std::cout << "user hook: scaled fp16 error " << errors[0] << ", fp16 "
            << errors[1] << std::endl;
  ronde::shutdown();
  return scenario_exit_code();
}

}  // namespace
