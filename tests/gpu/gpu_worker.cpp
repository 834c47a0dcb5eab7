// The worker of the GPU tests (gpu_test.cpp starts it as 1 or 2 ranks): the
// same checks as the CPU suites, on CUDA tensors. RONDE_CUDA_BACKEND picks
// NCCL (one rank: NCCL refuses two ranks on one GPU) or Gloo (two ranks on
// the same GPU, through staging copies). Every scenario compares with a
// reference computed here, on the same GPU.
//   gpu_worker probe | collectives | stream_order | optim OPT VARIANT |
//              amp fp16|bf16 | timeout | checkpoint_rng DIR
#include <ronde/ronde.h>

#include "test_net.h"
#include "worker_checks.h"

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <thread>

namespace {

int probe() {
  return torch::cuda::is_available() ? 0 : 77;
}

// Every dtype through every collective, with values whose results are exact.
int scenario_collectives() {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  const auto dev = ronde::device();
  CHECK_W(dev.is_cuda(), "ronde::device() is ", dev);
  for (auto dtype :
       {torch::kFloat,
        torch::kDouble,
        torch::kHalf,
        torch::kBFloat16,
        torch::kInt,
        torch::kLong,
        torch::kChar,
        torch::kByte,
        torch::kShort}) {
    auto opts = torch::TensorOptions().dtype(dtype).device(dev);
    const std::string what = c10::toString(dtype);
    // Sum, max and min of 1..n (small integers: exact in every dtype).
    auto x = torch::full({1000}, r + 1, opts);
    auto sum = ronde::allreduce(
        x, ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).name("s"));
    CHECK_W(sum.is_cuda(), what, ": result left the GPU");
    CHECK_W(
        torch::equal(sum.cpu(), torch::full({1000}, n * (n + 1) / 2, dtype)),
        what,
        " sum: ",
        sum.cpu().to(torch::kDouble).max().item<double>());
    auto mx = ronde::allreduce(
        x, ronde::AllreduceOptions().op(ronde::ReduceOp::Max).name("m"));
    CHECK_W(
        torch::equal(mx.cpu(), torch::full({1000}, n, dtype)), what, " max");
    auto in_place = x.clone();
    ronde::allreduce_(
        in_place, ronde::AllreduceOptions().op(ronde::ReduceOp::Min).name("i"));
    CHECK_W(
        torch::equal(in_place.cpu(), torch::full({1000}, 1, dtype)),
        what,
        " in-place min");
    if (torch::isFloatingType(dtype)) {
      auto avg = ronde::allreduce(
          x, ronde::AllreduceOptions().op(ronde::ReduceOp::Average).name("a"));
      CHECK_W(
          torch::allclose(
              avg.cpu().to(torch::kDouble),
              torch::full({1000}, (n + 1) / 2.0, torch::kDouble)),
          what,
          " average");
    }
    // Ragged allgather: rank q sends q + 1 rows of value q.
    auto mine = torch::full({r + 1, 3}, r, opts);
    auto all = ronde::allgather(mine);
    auto want = torch::empty({0, 3}, dtype);
    for (int q = 0; q < n; ++q)
      want = torch::cat({want, torch::full({q + 1, 3}, q, dtype)});
    CHECK_W(torch::equal(all.cpu(), want), what, " ragged allgather");
    // Broadcast from the last rank.
    auto b = torch::full({7}, r + 10, opts);
    ronde::broadcast_(b, n - 1);
    CHECK_W(
        torch::equal(b.cpu(), torch::full({7}, n - 1 + 10, dtype)),
        what,
        " broadcast");
    // Alltoall: rank q sends p + 1 rows of value q to rank p.
    std::vector<int64_t> splits;
    for (int p = 0; p < n; ++p)
      splits.push_back(p + 1);
    int64_t rows = 0;
    for (auto s : splits)
      rows += s;
    auto a2a_in = torch::full({rows, 2}, r, opts);
    auto h =
        ronde::alltoall_async(a2a_in, ronde::AlltoallOptions().splits(splits));
    auto got = h.result();
    auto recv = h.received_splits();
    auto want_a2a = torch::empty({0, 2}, dtype);
    for (int q = 0; q < n; ++q) {
      CHECK_W(recv[q] == r + 1, what, " alltoall splits from ", q);
      want_a2a = torch::cat({want_a2a, torch::full({r + 1, 2}, q, dtype)});
    }
    CHECK_W(torch::equal(got.cpu(), want_a2a), what, " alltoall");
    // Reducescatter of n * 2 rows: this rank's two rows, summed.
    auto rs = ronde::reducescatter(
        torch::full({n * 2, 4}, r + 1, opts),
        ronde::ReducescatterOptions().op(ronde::ReduceOp::Sum));
    CHECK_W(
        torch::equal(rs.cpu(), torch::full({2, 4}, n * (n + 1) / 2, dtype)),
        what,
        " reducescatter");
  }
  ronde::barrier();
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Cycles of at::cuda::sleep per millisecond on this GPU, measured.
double cycles_per_ms() {
  auto stream = c10::cuda::getCurrentCUDAStream();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, stream);
  at::cuda::sleep(100'000'000);
  cudaEventRecord(b, stream);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1e8 / std::max(ms, 0.001f);
}

// The all-reduce waits for the producer on the caller's (non-default)
// stream, and work queued after wait() runs after the collective. On NCCL
// wait() also returns while the device is still busy: the caller's stream
// is ordered after the collective, the host is not held. (Gloo stages
// through host memory, so there the host waits for the producer.) The
// postscale factor makes the collective write x even at one rank, where
// NCCL's in-place sum leaves it alone: run before the producer, it would
// scale zeros.
int scenario_stream_order() {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  const char* backend = std::getenv("RONDE_CUDA_BACKEND");
  const bool on_nccl = ronde::nccl_built() &&
                       !(backend != nullptr && std::string(backend) == "gloo");
  const auto dev = ronde::device();
  c10::cuda::CUDAGuard guard(dev);
  const double per_ms = cycles_per_ms();
  // Connect first: connecting takes longer than the producer below.
  ronde::allreduce_(torch::zeros({1}, torch::TensorOptions().device(dev)));
  torch::cuda::synchronize();
  auto side = c10::cuda::getStreamFromPool(false, dev.index());
  c10::cuda::CUDAStreamGuard on_side(side);
  // Round -1 warms up: the first launch of a kernel loads its module, which
  // waits for the device (CUDA's lazy loading), so the first postscaled
  // collective held the host until the producer ended (seen on an H200).
  for (int round = -1; round < 3; ++round) {
    auto x = torch::zeros({1 << 20}, torch::TensorOptions().device(dev));
    // 300 ms busy (10 ms to warm up)
    at::cuda::sleep(static_cast<int64_t>(per_ms * (round < 0 ? 10 : 300)));
    x.fill_(r + 1 + round);  // only after the sleep
    auto h = ronde::allreduce_async_(
        x,
        ronde::AllreduceOptions()
            .op(ronde::ReduceOp::Sum)
            .postscale_factor(3)
            .name("x"));
    h.wait();
    const bool busy = cudaStreamQuery(side.stream()) == cudaErrorNotReady;
    if (on_nccl && round >= 0) {
      CHECK_W(
          busy,
          "round ",
          round,
          ": wait() held the host until the device idled");
    }
    auto y = x * 2;  // queued after wait(): must see the reduced values
    double want = 2.0 * 3.0 * (n * (n + 1) / 2.0 + n * round);
    double got = y.min().item<double>();
    double got_max = y.max().item<double>();
    CHECK_W(
        got == want && got_max == want,
        "round ",
        round,
        ": got [",
        got,
        ", ",
        got_max,
        "], want ",
        want,
        " (the reduction ran before the producer)");
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

using ronde::testing::Net;

std::shared_ptr<torch::optim::Optimizer> make_optimizer(
    const std::string& name, std::vector<torch::Tensor> params) {
  if (name == "adam") {
    return std::make_shared<torch::optim::Adam>(
        params, torch::optim::AdamOptions(1e-2));
  }
  return std::make_shared<torch::optim::SGD>(
      params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// DistributedOptimizer on the GPU against one process on the whole global
// batch, on the same GPU, in double precision. Variants: plain, bpps2
// (two backward passes per step), unused (a registered layer that is never
// used), copy (gradients copied out of the buckets), smallbuckets (many
// buckets), fp16 (16-bit wire).
int scenario_optim(const std::string& opt_name, const std::string& variant) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  const auto dev = ronde::device();
  const int64_t per_rank = 16, steps = 20;
  const int k = variant == "bpps2" ? 2 : 1;
  torch::manual_seed(3);
  auto X = torch::randn({steps * k * n * per_rank, 32}, torch::kDouble).to(dev);
  auto Y = torch::randn({steps * k * n * per_rank, 8}, torch::kDouble).to(dev);
  auto make = [&] {
    torch::manual_seed(42);
    Net net(32, 64, 8, /*use_extra=*/variant != "unused");
    net->to(dev, torch::kDouble);
    return net;
  };
  Net model = make(), ref = make();
  auto opts = ronde::DistributedOptimizerOptions().backward_passes_per_step(k);
  if (variant == "copy")
    opts.gradient_as_bucket_view(false);
  if (variant == "smallbuckets")
    opts.fusion_threshold_mb(0.01).first_bucket_mb(0.01);
  if (variant == "fp16")
    opts.compression(ronde::Compression::FP16);
  ronde::DistributedOptimizer opt(
      make_optimizer(opt_name, model->parameters()),
      model->named_parameters(),
      opts);
  auto ref_opt = make_optimizer(opt_name, ref->parameters());
  int64_t row = 0;
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    ref_opt->zero_grad();
    for (int pass = 0; pass < k; ++pass) {
      auto xs = X.narrow(0, row, n * per_rank);
      auto ys = Y.narrow(0, row, n * per_rank);
      row += n * per_rank;
      // The mean over every micro-batch: the engine averages over ranks
      // and, with k passes, divides by k; the reference does it by hand.
      torch::mse_loss(
          model->forward(xs.narrow(0, r * per_rank, per_rank)),
          ys.narrow(0, r * per_rank, per_rank))
          .backward();
      torch::mse_loss(ref->forward(xs), ys).div(k).backward();
    }
    opt.step();
    ref_opt->step();
  }
  const double tol = variant == "fp16" ? 5e-3 : 1e-9;
  auto named = model->named_parameters();
  for (const auto& p : ref->named_parameters()) {
    auto got = named[p.key()];
    CHECK_W(got.is_cuda(), p.key(), " left the GPU");
    double diff = (got - p.value()).abs().max().item<double>();
    CHECK_W(diff <= tol, p.key(), ": max abs diff ", diff, " > ", tol);
  }
  // Replicas equal bitwise.
  auto flat = torch::cat({named["fc1.weight"].reshape({-1}),
                          named["fc3.bias"].reshape({-1})})
                  .unsqueeze(0);
  auto all = ronde::allgather(flat);
  for (int q = 1; q < n; ++q)
    CHECK_W(torch::equal(all[q], all[0]), "replica ", q, " differs");
  std::cout << "optim " << opt_name << " " << variant << " on " << dev << ": ok"
            << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// autocast (fp16 or bf16) and GradScaler on the GPU: an overflow on the last
// rank skips the same step everywhere and backs the scale off; the model
// still learns, and the replicas stay equal.
int scenario_amp(const std::string& kind) {
  ronde::init();
  const int n = ronde::size(), r = ronde::rank();
  const auto dev = ronde::device();
  const auto half = kind == "bf16" ? torch::kBFloat16 : torch::kHalf;
  torch::manual_seed(7);
  auto W = torch::randn({16, 4});
  auto X = torch::randn({n * 64, 16});
  auto Y = X.matmul(W);
  X = X.to(dev);
  Y = Y.to(dev);
  torch::manual_seed(11);
  torch::nn::Sequential model(
      torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  model->to(dev);
  ronde::broadcast_parameters(model->named_parameters(), 0);
  ronde::DistributedOptimizer opt(
      std::make_shared<torch::optim::SGD>(
          model->parameters(), torch::optim::SGDOptions(0.05)),
      model->named_parameters());
  ronde::GradScaler scaler(
      ronde::GradScalerOptions().init_scale(1024).growth_interval(1000));
  const int bad_step = 3;
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < 60; ++s) {
    opt.zero_grad();
    torch::Tensor loss;
    {
      ronde::AutocastGuard autocast(torch::kCUDA, half);
      auto out = model->forward(X.narrow(0, r * 64, 64));
      CHECK_W(
          out.scalar_type() == half,
          "autocast produced ",
          c10::toString(out.scalar_type()));
      loss = torch::mse_loss(out.to(torch::kFloat), Y.narrow(0, r * 64, 64));
    }
    if (s == bad_step && r == n - 1)
      loss = loss * std::numeric_limits<float>::infinity();
    const double before = scaler.get_scale();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    CHECK_W(stepped == (s != bad_step), "step ", s, " stepped=", stepped);
    if (s == bad_step) {
      CHECK_W(
          scaler.get_scale() == before / 2,
          "no back-off: ",
          scaler.get_scale());
    }
    if (s == 0)
      first_loss = ronde::allreduce(loss.detach()).item<double>();
    last_loss = ronde::allreduce(loss.detach()).item<double>();
  }
  CHECK_W(
      last_loss < 0.5 * first_loss,
      kind,
      ": loss went from ",
      first_loss,
      " to ",
      last_loss);
  for (const auto& p : model->parameters()) {
    CHECK_W(p.grad().scalar_type() == torch::kFloat, "master grads not fp32");
    auto all = ronde::allgather(p.detach().reshape({1, -1}));
    for (int q = 1; q < n; ++q)
      CHECK_W(torch::equal(all[q], all[0]), "replica ", q, " differs");
  }
  std::cout << "amp " << kind << ": loss " << first_loss << " -> " << last_loss
            << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// A collective stuck behind a long kernel outlives RONDE_TIMEOUT_SECONDS
// (the test sets 2): the watchdog aborts the communicator, and the error
// reaches the caller: with RONDE_BLOCKING_WAIT=1 from wait() itself, once
// the timeout passes and before the kernel ends; else wait() returns at
// once and the next collective raises. Never a hang.
int scenario_timeout() {
  const char* blocking_env = std::getenv("RONDE_BLOCKING_WAIT");
  const bool blocking =
      blocking_env != nullptr && std::string(blocking_env) == "1";
  ronde::init();
  const auto dev = ronde::device();
  c10::cuda::CUDAGuard guard(dev);
  const double per_ms = cycles_per_ms();
  auto x = torch::ones({1024}, torch::TensorOptions().device(dev));
  ronde::allreduce_(x);  // connects; quick
  const auto t0 = std::chrono::steady_clock::now();
  at::cuda::sleep(static_cast<int64_t>(per_ms * 6000));  // 6 s busy
  auto since_t0 = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
  };
  bool raised = false;
  std::string message, raised_by;
  double waited = -1;
  try {
    auto h = ronde::allreduce_async_(x, ronde::AllreduceOptions().name("late"));
    raised_by = "wait";
    h.wait();
    waited = since_t0();
    std::this_thread::sleep_for(std::chrono::seconds(4));
    raised_by = "next";
    ronde::allreduce_(x, ronde::AllreduceOptions().name("next"));
    raised_by = "nothing";
  } catch (const ronde::CommError& e) {
    raised = true;
    message = e.what();
  }
  const double s = since_t0();
  std::cout << "timeout raised=" << raised << " by " << raised_by << " after "
            << s << " s (wait returned after " << waited << " s): " << message
            << std::endl;
  CHECK_W(raised, "no CommError after the timeout");
  if (blocking) {
    // Raised by the watchdog's verdict (2 s and a tick), not by the kernel
    // ending at 6 s.
    CHECK_W(
        raised_by == "wait" && s > 1.5 && s < 5,
        "the blocking wait() should raise between 1.5 and 5 s; raised by ",
        raised_by,
        " after ",
        s,
        " s");
  } else {
    CHECK_W(
        waited >= 0 && waited < 1.0,
        "the ordering wait() should return at once, returned after ",
        waited,
        " s");
    CHECK_W(raised_by == "next", "raised by ", raised_by, ", not the next");
  }
  CHECK_W(
      message.find("did not finish") != std::string::npos ||
          message.find("aborted") != std::string::npos,
      "unclear message: ",
      message);
  CHECK_W(s < 20, "took ", s, " s");
  // Later collectives fail at once rather than hang.
  bool again = false;
  try {
    ronde::allreduce_(x);
  } catch (const ronde::CommError&) {
    again = true;
  }
  CHECK_W(again, "a collective after the abort did not raise");
  std::cout.flush();
  std::_Exit(ronde::testing::scenario_exit_code());  // the kernel may still run
}

// Checkpoints hold the device generator: what is drawn after a restore
// equals what was drawn after the save.
int scenario_checkpoint_rng(const std::string& dir) {
  ronde::init();
  const auto dev = ronde::device();
  torch::manual_seed(1234 + ronde::rank());
  auto drift = torch::rand({100}, torch::TensorOptions().device(dev));
  torch::nn::Linear model(4, 4);
  ronde::Checkpointer ckpt(dir, 1, 2);
  ckpt.add("model", *model);
  ckpt.save(1);
  auto after_save = torch::rand({1000}, torch::TensorOptions().device(dev));
  torch::manual_seed(99);  // anything else
  torch::rand({10}, torch::TensorOptions().device(dev));
  const auto step = ckpt.restore();
  CHECK_W(step && *step == 1, "restored step ", step.value_or(-1));
  auto after_restore = torch::rand({1000}, torch::TensorOptions().device(dev));
  CHECK_W(
      torch::equal(after_save, after_restore),
      "the device generator was not restored");
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  ronde::testing::install_crash_report();
  const std::string name = argc > 1 ? argv[1] : "";
  try {
    if (name == "probe")
      return probe();
    if (name == "collectives")
      return scenario_collectives();
    if (name == "stream_order")
      return scenario_stream_order();
    if (name == "optim")
      return scenario_optim(
          argc > 2 ? argv[2] : "sgd", argc > 3 ? argv[3] : "plain");
    if (name == "amp")
      return scenario_amp(argc > 2 ? argv[2] : "fp16");
    if (name == "timeout")
      return scenario_timeout();
    if (name == "checkpoint_rng" && argc > 2)
      return scenario_checkpoint_rng(argv[2]);
  } catch (const std::exception& e) {
    std::cout << "FAILED with an exception: " << e.what() << std::endl;
    return 3;
  }
  std::cerr << "gpu_worker: unknown scenario '" << name << "'" << std::endl;
  return 2;
}
