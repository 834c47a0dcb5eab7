// Gradient fusion benchmark: the 161 parameter tensors of ResNet-50 (25.5M
// parameters) reduced once per step by (a) one all-reduce per tensor, (b) one
// flat buffer (pack, reduce, unpack), and (c) DistributedOptimizer's buckets
// at several thresholds (--thresholds) and at the size the engine picks for
// the job's path when none is given. Every mode runs the same backward pass
// that produces the gradients, so modes differ only in how they communicate.
// (d) with --autotune, DistributedOptimizer with autotune on, timed once its
// search has chosen (the choice is in the JSON).
// Run: `ronderun -np 2 fusion_bench [--steps 5] [--autotune] [--json F]`.
#include <ronde/ronde.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

namespace {

// ResNet-50's parameter shapes in registration order: stem, 16 bottleneck
// blocks (4 with a projection), classifier.
std::vector<std::vector<int64_t>> resnet50_shapes() {
  std::vector<std::vector<int64_t>> s;
  auto conv_bn = [&](int64_t out, int64_t in, int64_t k) {
    s.push_back({out, in, k, k});
    s.push_back({out});
    s.push_back({out});
  };
  conv_bn(64, 3, 7);
  int64_t in = 64;
  const int64_t blocks[] = {3, 4, 6, 3};
  const int64_t planes[] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    for (int64_t b = 0; b < blocks[l]; ++b) {
      conv_bn(planes[l], in, 1);
      conv_bn(planes[l], planes[l], 3);
      conv_bn(planes[l] * 4, planes[l], 1);
      if (b == 0)
        conv_bn(planes[l] * 4, in, 1);
      in = planes[l] * 4;
    }
  }
  s.push_back({1000, 2048});
  s.push_back({1000});
  return s;
}

// An optimizer that does nothing: the benchmark times communication only.
struct NoStepOptions : torch::optim::OptimizerCloneableOptions<NoStepOptions> {
  double get_lr() const override {
    return 0;
  }
  void set_lr(const double) override {}
};
class NoStep : public torch::optim::Optimizer {
 public:
  explicit NoStep(std::vector<torch::Tensor> params)
      : Optimizer(std::move(params), std::make_unique<NoStepOptions>()) {}
  torch::Tensor step(LossClosure) override {
    return {};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double max_over_ranks(double v) {
  auto t = torch::full({1}, v, torch::kDouble);
  ronde::allreduce_(t, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
  return t.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5, warmup = 2, rounds = 3, trial_steps = 5;
  bool autotune = false;
  std::string json_path;
  std::vector<double> thresholds = {1, 4, 16, 25, 64, 128};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::stoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::stoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--autotune")
      autotune = true;
    else if (a == "--autotune-steps" && i + 1 < argc)
      trial_steps = std::stoi(argv[++i]);
    else if (a == "--thresholds" && i + 1 < argc) {
      thresholds.clear();
      std::stringstream list(argv[++i]);
      for (std::string mb; std::getline(list, mb, ',');)
        thresholds.push_back(std::stod(mb));
    }
    else {
      std::cerr << "usage: fusion_bench [--steps N] [--rounds R] "
                   "[--thresholds MB,MB,...] [--autotune [--autotune-steps N]] "
                   "[--json FILE]\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  ronde::init();
  const int rank = ronde::rank();
  torch::manual_seed(0);
  torch::OrderedDict<std::string, torch::Tensor> named;
  std::vector<torch::Tensor> params;
  int64_t total = 0;
  auto shapes = resnet50_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto p = torch::randn(shapes[i]).requires_grad_();
    named.insert("p" + std::to_string(i), p);
    params.push_back(p);
    total += p.numel();
  }
  // The same cheap backward for every mode: d(sum(p * c))/dp = c.
  auto backward = [&] {
    torch::Tensor loss = torch::zeros({});
    for (auto& p : params)
      loss = loss + (p * 0.5).sum();
    loss.backward();
  };
  auto zero = [&] {
    for (auto& p : params)
      p.mutable_grad().reset();
  };
  auto time_mode = [&](const std::function<void()>& step) {
    for (int i = 0; i < warmup; ++i)
      step();
    std::vector<double> samples;
    for (int i = 0; i < steps; ++i) {
      ronde::barrier();
      auto t0 = std::chrono::steady_clock::now();
      step();
      samples.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count());
    }
    return max_over_ranks(median(samples));
  };
  auto off = ronde::AllreduceOptions().verify(false);
  // Each mode returns its median step time over one round.
  std::vector<std::pair<std::string, std::function<double()>>> modes;
  // Backward alone: the floor every mode stands on.
  modes.emplace_back("backward_only", [&] {
    return time_mode([&] {
      zero();
      backward();
    });
  });
  modes.emplace_back("per_tensor", [&] {
    return time_mode([&] {
      zero();
      backward();
      std::vector<ronde::Handle> hs;
      for (auto& p : params)
        hs.push_back(ronde::allreduce_async_(p.grad(), off));
      for (auto& h : hs)
        h.wait();
    });
  });
  modes.emplace_back("flat_buffer", [&] {
    return time_mode([&] {
      zero();
      backward();
      std::vector<torch::Tensor> flat;
      for (auto& p : params)
        flat.push_back(p.grad().reshape({-1}));
      torch::Tensor buf = torch::cat(flat);
      ronde::allreduce_(buf, off);
      int64_t o = 0;
      for (auto& p : params) {
        p.grad().copy_(buf.narrow(0, o, p.numel()).view(p.sizes()));
        o += p.numel();
      }
    });
  });
  for (double mb : thresholds) {
    std::ostringstream name;
    name << "buckets_" << mb << "MB";
    modes.emplace_back(name.str(), [&, mb] {
      // Alive only while measured: every live optimizer hooks every gradient.
      ronde::DistributedOptimizer d(
          std::make_shared<NoStep>(params),
          named,
          ronde::DistributedOptimizerOptions().fusion_threshold_mb(mb));
      return time_mode([&] {
        d.zero_grad(false);
        backward();
        d.step();
      });
    });
  }
  // No size given: what the engine picks for this job's path.
  double default_mb = 0;
  modes.emplace_back("default", [&] {
    ronde::DistributedOptimizer d(
        std::make_shared<NoStep>(params),
        named,
        ronde::DistributedOptimizerOptions());
    default_mb = d.bucket_sizing().fusion_threshold_mb;
    return time_mode([&] {
      d.zero_grad(false);
      backward();
      d.step();
    });
  });
  // Autotune's choice in each round (the last one reported).
  ronde::BucketSizing tuned;
  int tuning_steps = 0;
  if (autotune) {
    modes.emplace_back("autotune", [&] {
      ronde::DistributedOptimizer d(
          std::make_shared<NoStep>(params),
          named,
          ronde::DistributedOptimizerOptions()
              .autotune(true)
              .autotune_steps_per_trial(trial_steps));
      tuning_steps = 0;
      while (!d.bucket_sizing().autotuned && tuning_steps < 200) {
        d.zero_grad(false);
        backward();
        d.step();
        ++tuning_steps;
      }
      tuned = d.bucket_sizing();
      return time_mode([&] {
        d.zero_grad(false);
        backward();
        d.step();
      });
    });
  }
  std::vector<std::vector<double>> per_round(modes.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t m = 0; m < modes.size(); ++m) {
      per_round[m].push_back(modes[m].second());
    }
  }
  std::vector<std::pair<std::string, double>> results;
  for (size_t m = 0; m < modes.size(); ++m) {
    results.emplace_back(modes[m].first, median(per_round[m]));
  }
  if (rank == 0) {
    double best = 1e9, per_tensor = 0, floor = 0, fallback = 0;
    std::string best_mode;
    for (auto& [n, t] : results) {
      if (n == "per_tensor")
        per_tensor = t;
      if (n == "backward_only")
        floor = t;
      if (n == "default")
        fallback = t;
      // The best of per-tensor, the flat buffer and every fixed size.
      if (n != "backward_only" && n != "autotune" && n != "default" &&
          t < best) {
        best = t;
        best_mode = n;
      }
    }
    std::printf(
        "# fusion: ResNet-50 gradients (%zu tensors, %.1fM params), %d ranks, "
        "median over %d rounds of the median of %d steps\n",
        params.size(),
        total / 1e6,
        ronde::size(),
        rounds,
        steps);
    std::printf(
        "%-16s %9s %8s %12s %13s %12s\n",
        "mode",
        "step_ms",
        "vs_best",
        "per_tensor/x",
        "beyond_bw_ms",
        "per_tensor/x");
    std::ostringstream js;
    js << "{\"benchmark\":\"fusion\",\"ranks\":" << ronde::size()
       << ",\"tensors\":" << params.size() << ",\"params\":" << total
       << ",\"steps\":" << steps;
    if (autotune) {
      js << ",\"autotune\":{\"fusion_threshold_mb\":"
         << tuned.fusion_threshold_mb
         << ",\"first_bucket_mb\":" << tuned.first_bucket_mb
         << ",\"autotuned\":" << (tuned.autotuned ? "true" : "false")
         << ",\"tuning_steps\":" << tuning_steps
         << ",\"steps_per_trial\":" << trial_steps << "}";
      std::printf(
          "# autotune chose %g MiB, first bucket %g MiB, in %d steps\n",
          tuned.fusion_threshold_mb,
          tuned.first_bucket_mb,
          tuning_steps);
    }
    if (fallback > 0) {
      // The default bucket size against the best of every fixed size and
      // per-tensor in this run.
      std::printf(
          "# the default (%g MiB buckets on this path) is %.3fx the best "
          "(%s)\n",
          default_mb,
          fallback / best,
          best_mode.c_str());
      js << ",\"default_mb\":" << default_mb << ",\"best_mode\":\""
         << best_mode << "\",\"default_vs_best\":" << fallback / best;
    }
    js << ",\"results\":[";
    bool first = true;
    for (auto& [n, t] : results) {
      // Time beyond the backward pass: communication not hidden by it.
      double extra = t - floor;
      std::printf(
          "%-16s %9.1f %7.2fx %11.2fx %13.1f %11.2fx\n",
          n.c_str(),
          t * 1e3,
          t / best,
          per_tensor / t,
          extra * 1e3,
          extra > 0 ? (per_tensor - floor) / extra : 0.0);
      js << (first ? "" : ",") << "{\"mode\":\"" << n
         << "\",\"step_ms\":" << t * 1e3
         << ",\"beyond_backward_ms\":" << extra * 1e3 << "}";
      first = false;
    }
    js << "]}";
    if (!json_path.empty())
      std::ofstream(json_path) << js.str() << "\n";
  }
  ronde::shutdown();
  return 0;
}
