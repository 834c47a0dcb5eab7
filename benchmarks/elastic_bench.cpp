// Elastic recovery and commit cost on an mlp (Linear 1024-W-W-W-1000 with
// ReLU, SGD with momentum). benchmarks/run_elastic.py runs both modes side
// by side:
//   --mode elastic     under ronderun --min-np: ronde::elastic::run, a
//                      commit every --commit-every steps
//   --mode checkpoint  under torchrun --max-restarts 1: a Checkpointer
//                      file every --commit-every steps, restored at start
// Rank --kill-rank writes the time to --kill-file and dies of SIGKILL at
// step --kill-step (in the first attempt only). Rank 0 reports the time
// from that kill to the end of the first step completed after recovery,
// the steps lost, the median step and commit times, and what a memcpy of
// the committed bytes takes.
#include <ronde/ronde.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

namespace {

double now_s() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A memcpy of `bytes` bytes, the best of three.
double memcpy_seconds(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes);
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(
        best,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "elastic", kill_file, dir = "elastic-bench-ckpt",
              json_path;
  int64_t steps = 30, commit_every = 10, kill_step = -1, width = 4096;
  int kill_rank = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      return i + 1 < argc ? std::string(argv[++i]) : std::string();
    };
    if (a == "--mode")
      mode = next();
    else if (a == "--steps")
      steps = std::stoll(next());
    else if (a == "--commit-every")
      commit_every = std::stoll(next());
    else if (a == "--kill-rank")
      kill_rank = std::stoi(next());
    else if (a == "--kill-step")
      kill_step = std::stoll(next());
    else if (a == "--kill-file")
      kill_file = next();
    else if (a == "--dir")
      dir = next();
    else if (a == "--width")
      width = std::stoll(next());
    else if (a == "--json")
      json_path = next();
    else {
      std::cerr << "usage: elastic_bench --mode elastic|checkpoint [--steps N] "
                   "[--commit-every K] [--kill-rank R --kill-step S "
                   "--kill-file F] [--dir D] [--width W] [--json F]\n";
      return 2;
    }
  }
  TORCH_CHECK(mode == "elastic" || mode == "checkpoint", "unknown mode ", mode);
  at::set_num_threads(1);
  torch::manual_seed(0);
  ronde::init();
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool first_attempt = restart == nullptr || std::string(restart) == "0";
  const int launch_rank = ronde::rank();

  torch::nn::Sequential model(
      torch::nn::Linear(1024, width),
      torch::nn::ReLU(),
      torch::nn::Linear(width, width),
      torch::nn::ReLU(),
      torch::nn::Linear(width, width),
      torch::nn::ReLU(),
      torch::nn::Linear(width, 1000));
  ronde::broadcast_parameters(model->named_parameters(), 0);
  auto base = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  ronde::DistributedOptimizer opt(base, model->named_parameters());
  const int64_t batch = 64;
  auto x = torch::randn({batch, 1024});
  auto y = torch::randint(0, 1000, {batch});

  int64_t step = 0;
  std::vector<double> step_times, commit_times;
  bool recovering = false;
  double recovered_at = 0;
  int64_t resumed_from = -1;
  auto one_step = [&] {
    if (first_attempt && launch_rank == kill_rank && step == kill_step) {
      std::ofstream(kill_file) << std::to_string(now_s()) << "\n";
      ::kill(::getpid(), SIGKILL);
    }
    auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad(false);
    torch::cross_entropy_loss(model->forward(x), y).backward();
    opt.step();
    ++step;
    step_times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
    if (recovering) {
      recovering = false;
      recovered_at = now_s();
    }
  };
  size_t committed_bytes = 0;
  if (mode == "elastic") {
    ronde::elastic::State state;
    state.add("model", *model).add("optimizer", opt).add("step", step);
    state.on_reset([&] {
      recovering = true;
      resumed_from = step;
    });
    ronde::elastic::run(state, [&] {
      while (step < steps) {
        one_step();
        if (step % commit_every == 0) {
          auto t0 = std::chrono::steady_clock::now();
          state.commit();
          commit_times.push_back(std::chrono::duration<double>(
                                     std::chrono::steady_clock::now() - t0)
                                     .count());
        }
      }
    });
    committed_bytes = state.committed_bytes();
  } else {
    ronde::Checkpointer ckpt(dir, commit_every, 1);
    ckpt.add("model", *model).add("optimizer", opt).add("step", step);
    if (ckpt.restore() && !first_attempt) {
      recovering = true;
      resumed_from = step;
    }
    while (step < steps) {
      one_step();
      auto t0 = std::chrono::steady_clock::now();
      if (ckpt.maybe_save(step))
        commit_times.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count());
    }
  }
  if (ronde::rank() == 0) {
    double killed_at = 0;
    std::ifstream(kill_file) >> killed_at;
    const double recovery =
        recovered_at > 0 && killed_at > 0 ? recovered_at - killed_at : -1;
    const double copy = committed_bytes ? memcpy_seconds(committed_bytes) : 0;
    std::printf(
        "%s: %d rank(s) at the end, median step %.1f ms, median commit %.1f "
        "ms (%zu bytes; memcpy %.1f ms), recovery %.2f s, resumed from step "
        "%lld (killed at %lld)\n",
        mode.c_str(),
        ronde::size(),
        median(step_times) * 1e3,
        median(commit_times) * 1e3,
        committed_bytes,
        copy * 1e3,
        recovery,
        static_cast<long long>(resumed_from),
        static_cast<long long>(kill_step));
    if (!json_path.empty()) {
      std::ofstream(json_path)
          << "{\"mode\":\"" << mode << "\",\"ranks_at_end\":" << ronde::size()
          << ",\"step_s\":" << median(step_times)
          << ",\"commit_s\":" << median(commit_times)
          << ",\"commit_every\":" << commit_every
          << ",\"committed_bytes\":" << committed_bytes
          << ",\"memcpy_s\":" << copy << ",\"recovery_s\":" << recovery
          << ",\"resumed_from\":" << resumed_from
          << ",\"kill_step\":" << kill_step << "}\n";
    }
  }
  ronde::shutdown();
  return 0;
}
