// One rank of the sharding benchmark (run_zero.py starts it under
// ronderun): an MLP of `layers` square Linear layers of `width` (each
// weight width^2 elements: 25M at width 5000), Adam, ZeRO stage 0, 1 or 2,
// with `--compression fp16|bf16` a 16-bit wire; `--bias 0` leaves the
// layers' biases out (each weight then a bucket of its own, as the bias-free
// layers of many transformers).
// Rank 0 prints one JSON line: the optimizer-state bytes per rank (the
// largest), peak resident memory per rank (the largest, VmHWM), and the
// median step time after a warm-up step.
#include <ronde/ronde.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0)
      return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int stage = 0, layers = 4, steps = 4, batch = 8, bias = 1;
  int64_t width = 5000;
  ronde::Compression compression = ronde::Compression::None;
  std::string wire = "none";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--compression") {
      wire = argv[i + 1];
      if (wire == "fp16")
        compression = ronde::Compression::FP16;
      else if (wire == "bf16")
        compression = ronde::Compression::BF16;
      else if (wire != "none") {
        std::fprintf(
            stderr, "zero_bench: unknown compression '%s'\n", wire.c_str());
        return 2;
      }
    } else if (k == "--stage")
      stage = v;
    else if (k == "--layers")
      layers = v;
    else if (k == "--width")
      width = v;
    else if (k == "--steps")
      steps = v;
    else if (k == "--batch")
      batch = v;
    else if (k == "--bias")
      bias = v;
  }
  ronde::init();
  torch::manual_seed(1);
  torch::nn::Sequential net;
  for (int l = 0; l < layers; ++l)
    net->push_back(torch::nn::Linear(
        torch::nn::LinearOptions(width, width).bias(bias != 0)));
  auto base = std::make_shared<torch::optim::Adam>(
      net->parameters(), torch::optim::AdamOptions(1e-4));
  ronde::DistributedOptimizer opt(
      base,
      net->named_parameters(),
      ronde::DistributedOptimizerOptions()
          .shard_optimizer_state(stage >= 1)
          .shard_gradients(stage >= 2)
          .compression(compression));
  torch::Tensor x = torch::randn({batch, width});
  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    net->forward(x).pow(2).mean().backward();
    opt.step();
    const double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (s > 0)
      times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  int64_t params = 0;
  for (const auto& p : net->parameters())
    params += p.numel();
  auto figures = torch::tensor(
      {static_cast<double>(opt.optimizer_state_bytes()),
       peak_rss_mb(),
       times[times.size() / 2]},
      torch::kDouble);
  figures = ronde::allreduce(
      figures, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
  if (ronde::rank() == 0) {
    std::printf(
        "{\"stage\": %d, \"compression\": \"%s\", \"np\": %d, "
        "\"bias\": %s, \"params\": %lld, "
        "\"state_bytes_per_rank\": %.0f, \"peak_rss_mb\": %.1f, "
        "\"step_s\": %.4f}\n",
        stage,
        wire.c_str(),
        ronde::size(),
        bias != 0 ? "true" : "false",
        static_cast<long long>(params),
        figures[0].item<double>(),
        figures[1].item<double>(),
        figures[2].item<double>());
  }
  ronde::shutdown();
  return 0;
}
