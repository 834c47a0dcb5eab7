// Checkpoint scenario for the multirank worker: trains a small model with
// dropout (a random stream per rank), momentum SGD, a warmup schedule, a
// loss scaler and the distributed sampler for `total` steps, checkpointing
// every `every` steps, optionally killing rank 1 with SIGKILL after step
// `kill_at` (or, with "b<N>", inside the backward pass of step N+1, while
// rank 0's all-reduce waits for it). Every rank ends by printing a hash of its
// parameters, which the test compares across an interrupted-and-resumed run and
// a straight one.
//
//   worker checkpoint DIR TOTAL EVERY KILL_AT|bKILL_AT
#include <ronde/ronde.h>

#include "scenario_registry.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <dlfcn.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

// A kill in the middle of a checkpoint write, for the fault tests. With
// RONDE_TEST_KILL_WRITING=NAME in the environment, the second write(2) to a
// file whose name ends with NAME (the checkpoint's payload, after its
// header) writes half its bytes and then the process dies by SIGKILL. This
// definition replaces libc's write for libronde too (the executable comes
// first in the symbol lookup); unarmed, it only forwards.
extern "C" ssize_t write(int fd, const void* buf, size_t n) {
  using WriteFn = ssize_t (*)(int, const void*, size_t);
  static WriteFn real = reinterpret_cast<WriteFn>(dlsym(RTLD_NEXT, "write"));
  static const char* armed = std::getenv("RONDE_TEST_KILL_WRITING");
  if (armed != nullptr && *armed != '\0' && fd > 2) {
    char link[64];
    char target[4096];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, target, sizeof target - 1);
    const size_t want = std::strlen(armed);
    if (len >= static_cast<ssize_t>(want) &&
        std::memcmp(target + len - want, armed, want) == 0) {
      static int writes = 0;
      if (++writes == 2) {
        real(fd, buf, n / 2);
        static const char msg[] = "worker: killed while writing a checkpoint\n";
        real(2, msg, sizeof msg - 1);
        std::raise(SIGKILL);
      }
    }
  }
  return real(fd, buf, n);
}

namespace {

int scenario_checkpoint(
    const std::string& dir,
    int64_t total,
    int64_t every,
    int64_t kill_at,
    bool kill_in_backward) {
  ronde::init();
  const int rank = ronde::rank();
  torch::manual_seed(0);
  torch::nn::Sequential net(
      torch::nn::Linear(8, 32),
      torch::nn::ReLU(),
      torch::nn::Dropout(0.3),
      torch::nn::Linear(32, 1));
  ronde::broadcast_parameters(net->named_parameters(), 0);
  torch::manual_seed(100 + rank);  // dropout masks differ per rank

  auto gen_x = torch::make_generator<at::CPUGeneratorImpl>(7);
  auto x = torch::randn({256, 8}, gen_x, torch::TensorOptions());
  auto y = x.sum(1, true) +
           0.1 * torch::randn({256, 1}, gen_x, torch::TensorOptions());

  auto sgd = std::make_shared<torch::optim::SGD>(
      net->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  ronde::DistributedOptimizer opt(
      sgd,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions().lr_scaling(
          ronde::LrScaling::Linear));
  ronde::WarmupScheduler sched(
      opt,
      ronde::WarmupOptions().warmup_steps(6).then(ronde::Decay::cosine(total)));
  ronde::GradScaler scaler(
      ronde::GradScalerOptions().init_scale(1024).growth_interval(3));
  ronde::DistributedSampler sampler(
      256, ronde::DistributedSamplerOptions().seed(3));

  int64_t step = 0;
  int64_t epoch = 0;
  ronde::Checkpointer ckpt(dir, every, /*keep_last=*/2);
  ckpt.add("model", *net)
      .add("optimizer", opt)
      .add("schedule", sched)
      .add("scaler", scaler)
      .add("sampler", sampler)
      .add("step", step)
      .add("epoch", epoch);
  if (auto restored = ckpt.restore()) {
    std::cout << "rank " << rank << ": restored step " << *restored
              << " (epoch " << epoch << ")" << std::endl;
  } else {
    std::cout << "rank " << rank << ": fresh start" << std::endl;
  }
  while (step < total) {
    auto indices = sampler.next(8);
    if (!indices) {
      sampler.set_epoch(++epoch);
      indices = sampler.next(8);
    }
    auto idx =
        torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()));
    opt.zero_grad();
    auto loss = torch::mse_loss(
        net->forward(x.index_select(0, idx)), y.index_select(0, idx));
    if (kill_in_backward && step == kill_at && rank == 1) {
      // The first layer's gradient comes last in backward: rank 0 has
      // launched its all-reduce and waits for this rank when it dies.
      net[0]->as<torch::nn::Linear>()->weight.register_hook(
          [](torch::Tensor g) {
            std::cout << "rank 1: killing myself inside backward" << std::endl;
            std::raise(SIGKILL);
            return g;
          });
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    sched.step();
    ++step;
    if (!kill_in_backward && step == kill_at && rank == 1) {
      std::cout << "rank 1: killing myself after step " << step << std::endl;
      std::raise(SIGKILL);
    }
    ckpt.maybe_save(step);
  }
  // FNV-1a over the parameters' bytes: equal only for bitwise equal values.
  uint64_t hash = 1469598103934665603ull;
  for (const auto& p : net->parameters()) {
    auto c = p.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) {
      hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
  }
  char hex[24];
  std::snprintf(
      hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  std::cout << "rank " << rank << ": params " << hex << " after step " << step
            << ", loss scale " << scaler.get_scale() << std::endl;
  ronde::shutdown();
  return 0;
}

// Rank 1 sleeps `sleep_s` seconds before an all-reduce that rank 0 enters at
// once: the stall inspector must notice (see StallInspector tests).
int scenario_stall(double sleep_s) {
  ronde::init();
  ronde::barrier();
  if (ronde::rank() == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  }
  try {
    auto sum = ronde::allreduce(
        torch::ones({4}),
        ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).name("late tensor"));
    std::cout << "rank " << ronde::rank() << ": sum " << sum[0].item<float>()
              << std::endl;
  } catch (const ronde::CommError& e) {
    std::cout << "rank " << ronde::rank() << ": COMM_ERROR: " << e.what()
              << std::endl;
    return 4;
  }
  ronde::shutdown();
  return 0;
}

// A checkpoint saved while the last rank is in ronde::join(), restored
// once every rank is back: the model as the others saved it on every rank,
// their random streams as they were at the save, and on the joined rank
// its own stream untouched and one line saying it was not saved.
int scenario_save_while_joined(const std::string& dir) {
  ronde::init();
  const int n = ronde::size(), rank = ronde::rank();
  const bool joins_early = rank == n - 1;
  torch::manual_seed(0);
  torch::nn::Linear net(8, 4);
  ronde::DistributedOptimizer opt(
      std::make_shared<torch::optim::SGD>(
          net->parameters(), torch::optim::SGDOptions(0.1)),
      net->named_parameters());
  ronde::Checkpointer ckpt(dir, /*every_n_steps=*/1000, /*keep_last=*/2);
  ckpt.add("model", *net).add("optimizer", opt);
  torch::manual_seed(100 + rank);  // a stream of its own per rank
  auto params = [&] {
    return torch::cat({net->weight.detach().reshape({-1}), net->bias.detach()});
  };
  torch::Tensor saved, next_draw;
  for (int s = 0; s < (joins_early ? 1 : 3); ++s) {
    opt.zero_grad();
    net->forward(torch::rand({2, 8})).sum().backward();
    opt.step();
  }
  if (!joins_early) {
    ckpt.save(3);
    saved = params().clone();
    next_draw = torch::rand({4});  // what follows the saved stream
  }
  ronde::join();
  {
    torch::NoGradGuard g;
    net->weight.add_(1);
  }
  auto gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor state_before = gen.get_state();
  const auto step = ckpt.restore();
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::cout << "FAILED on rank " << rank << ": " << what << std::endl;
    }
  };
  check(step && *step == 3, "restore() did not find step 3");
  at::Tensor all = ronde::allgather(params().unsqueeze(0));
  for (int q = 1; q < n; ++q)
    check(torch::equal(all[q], all[0]), "replica " + std::to_string(q));
  if (joins_early) {
    check(
        torch::equal(gen.get_state(), state_before),
        "the joined rank's generator changed");
  } else {
    check(torch::equal(params(), saved), "the model is not the saved one");
    check(
        torch::equal(torch::rand({4}), next_draw),
        "the random stream is not the saved one");
  }
  ronde::shutdown();
  return failures == 0 ? 0 : 1;
}

RONDE_SCENARIO(save_while_joined) {
  if (argc != 3) {
    std::cerr << "usage: worker save_while_joined DIR" << std::endl;
    return 2;
  }
  return scenario_save_while_joined(argv[2]);
}

RONDE_SCENARIO(stall) {
  return scenario_stall(argc > 2 ? std::stod(argv[2]) : 5);
}

RONDE_SCENARIO(checkpoint) {
  if (argc != 6) {
    std::cerr << "usage: worker checkpoint DIR TOTAL EVERY [b]KILL_AT"
              << std::endl;
    return 2;
  }
  try {
    const std::string kill = argv[5];
    const bool in_backward = !kill.empty() && kill[0] == 'b';
    return scenario_checkpoint(
        argv[2],
        std::stoll(argv[3]),
        std::stoll(argv[4]),
        std::stoll(in_backward ? kill.substr(1) : kill),
        in_backward);
  } catch (const ronde::CommError& e) {
    std::cout << "rank " << ronde::rank() << ": COMM_ERROR: " << e.what()
              << std::endl;
    return 4;
  } catch (const c10::Error& e) {
    std::cout << "rank " << (ronde::is_initialized() ? ronde::rank() : -1)
              << ": ERROR: " << e.what_without_backtrace() << std::endl;
    return 3;
  }
}

}  // namespace
