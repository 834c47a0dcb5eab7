// What ronde's profiler ranges cost: a span (runtime/span.h, one per pack,
// launch, collective, wait, unpack and step) with no profiler and no
// timeline against an empty loop body, and with a Kineto CPU profiler
// recording; and how many spans a training step of a small model makes,
// against that step's time. Rounds alternate the sides; medians; JSON on
// rank 0's stdout.
//
//   ronderun -np 2 -- span_bench [--spans N] [--steps S] [--rounds R]
#include "runtime/span.h"

#include <ronde/ronde.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Nanoseconds per iteration of `n` spans (or of an empty body).
double per_span_ns(int n, bool span) {
  const auto t = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (span) {
      ronde::detail::Span s("ronde::bench");
      asm volatile("" : : "r"(&s) : "memory");
    } else {
      asm volatile("" : : : "memory");
    }
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t).count() / n;
}

void enable_cpu_profiler() {
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  const std::set<impl::ActivityType> cpu{impl::ActivityType::CPU};
  prof::prepareProfiler(config, cpu);
  prof::enableProfiler(config, cpu);
}

}  // namespace

int main(int argc, char** argv) {
  int spans = 200000, steps = 50, rounds = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--spans"))
      spans = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      rounds = std::atoi(argv[i + 1]);
  }
  at::set_num_threads(1);
  ronde::init();
  std::vector<double> empty, off, on;
  for (int r = 0; r < rounds; ++r) {
    empty.push_back(per_span_ns(spans, false));
    off.push_back(per_span_ns(spans, true));
  }
  enable_cpu_profiler();
  for (int r = 0; r < rounds; ++r)
    on.push_back(per_span_ns(spans / 10, true));
  prof::disableProfiler();

  // A step of an MLP in 3 buckets, then the spans one step records.
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(
      torch::nn::Linear(256, 256),
      torch::nn::ReLU(),
      torch::nn::Linear(256, 256),
      torch::nn::ReLU(),
      torch::nn::Linear(256, 256),
      torch::nn::ReLU(),
      torch::nn::Linear(256, 10));
  ronde::DistributedOptimizer opt(
      std::make_shared<torch::optim::SGD>(
          model->parameters(), torch::optim::SGDOptions(0.01)),
      model->named_parameters(),
      ronde::DistributedOptimizerOptions()
          .fusion_threshold_mb(0.2)
          .first_bucket_mb(0.2));
  const auto x = torch::randn({64, 256});
  const auto y = torch::randint(0, 10, {64});
  auto step = [&] {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt.step();
  };
  for (int i = 0; i < 5; ++i)
    step();
  std::vector<double> step_ms;
  for (int r = 0; r < rounds; ++r) {
    const auto t = Clock::now();
    for (int i = 0; i < steps; ++i)
      step();
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - t).count() /
        steps);
  }
  enable_cpu_profiler();
  step();
  auto result = prof::disableProfiler();
  int per_step = 0;
  for (const auto& e : result->events())
    per_step += e.name().rfind("ronde::", 0) == 0 ? 1 : 0;
  const double span_ns = median(off) - median(empty);
  const double ms = median(step_ms);
  if (ronde::rank() == 0)
    std::printf(
        "{\n  \"empty_loop_ns\": %.2f,\n  \"span_ns\": %.2f,\n"
        "  \"span_profiled_ns\": %.0f,\n  \"spans_per_step\": %d,\n"
        "  \"step_ms\": %.3f,\n  \"span_share_of_step\": %.2e,\n"
        "  \"ranks\": %d\n}\n",
        median(empty),
        span_ns,
        median(on) - median(empty),
        per_step,
        ms,
        span_ns * per_step / (ms * 1e6),
        ronde::size());
  ronde::shutdown();
  return 0;
}
