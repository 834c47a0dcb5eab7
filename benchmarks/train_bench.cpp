// Training throughput: the mlp and cnn workloads on synthetic data, plain
// LibTorch (one process, no communication) or with DistributedOptimizer
// under ronderun. benchmarks/run_train.py runs every mode side by side with
// PyTorch's DistributedDataParallel (ddp_train_bench.py, the same models).
//   train_bench --workload mlp|cnn --mode local|ronde [--steps N] [--json F]
//               [--device cpu|cuda] [--batch N] [--windows N] [--sync-bn]
//               [--autotune] [--shard 0|1|2]
// --shard 1 shards the optimizer state over the ranks (ZeRO stage 1), 2 the
// gradients as well (stage 2); ronde mode only.
// --autotune turns the bucket-size search on and warms up until it has
// chosen (at most 400 steps); the JSON gives the sizes the steps ran with.
// On CUDA a step's time is a window of `steps` steps between two device
// synchronizations, divided by `steps`; the median over --windows windows is
// reported (tests/gpu/run_gpu_checks.sh runs local and ronde alternately).
#include <ronde/ronde.h>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

#include <time.h>

namespace {

// CPU seconds used so far by this thread, or by the whole process.
double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Linear 1024-4096-4096-4096-1000 with ReLU.
torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(
      torch::nn::Linear(1024, 4096),
      torch::nn::ReLU(),
      torch::nn::Linear(4096, 4096),
      torch::nn::ReLU(),
      torch::nn::Linear(4096, 4096),
      torch::nn::ReLU(),
      torch::nn::Linear(4096, 1000));
}

// Batch norm of `c` channels registered as `name`: torch's, or ronde's
// SyncBatchNorm (--sync-bn), called the same way.
torch::nn::AnyModule batch_norm(
    torch::nn::Module& parent, const std::string& name, int64_t c, bool sync) {
  if (sync) {
    return torch::nn::AnyModule(
        parent.register_module(name, ronde::nn::SyncBatchNorm(c)));
  }
  return torch::nn::AnyModule(
      parent.register_module(name, torch::nn::BatchNorm2d(c)));
}

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride, bool sync) {
    using namespace torch::nn;
    conv1 = register_module(
        "conv1",
        Conv2d(
            Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = batch_norm(*this, "bn1", out, sync);
    conv2 = register_module(
        "conv2", Conv2d(Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = batch_norm(*this, "bn2", out, sync);
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          Sequential(
              Conv2d(Conv2dOptions(in, out, 1).stride(stride).bias(false)),
              BatchNorm2d(out)));
      if (sync)
        ronde::convert_sync_batchnorm(*shortcut);
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1.forward(conv1->forward(x)));
    y = bn2.forward(conv2->forward(y));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::AnyModule bn1, bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// ResNet-18 for 3x32x32 inputs (CIFAR layout: 3x3 stem, no max-pool).
struct ResNet18Impl : torch::nn::Module {
  explicit ResNet18Impl(bool sync) {
    using namespace torch::nn;
    stem = register_module(
        "stem", Conv2d(Conv2dOptions(3, 64, 3).padding(1).bias(false)));
    bn = batch_norm(*this, "bn", 64, sync);
    int64_t in = 64;
    const int64_t planes[] = {64, 128, 256, 512};
    for (int l = 0; l < 4; ++l) {
      for (int b = 0; b < 2; ++b) {
        layers->push_back(
            BasicBlock(in, planes[l], b == 0 && l > 0 ? 2 : 1, sync));
        in = planes[l];
      }
    }
    register_module("layers", layers);
    fc = register_module("fc", Linear(512, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn.forward(stem->forward(x)));
    x = layers->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc->forward(x);
  }
  torch::nn::Conv2d stem{nullptr};
  torch::nn::AnyModule bn;
  torch::nn::Sequential layers;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18);

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload = "mlp", mode = "local", json_path, compression = "none";
  std::string device_name = "cpu";
  int steps = 10, warmup = 3, windows = 5;
  int64_t batch_arg = 0;
  // cnn: ronde's SyncBatchNorm in place of BatchNorm2d.
  bool sync_bn = false;
  bool autotune = false;
  int shard = 0;  // ZeRO stage: 0 (none), 1 or 2
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      return i + 1 < argc ? std::string(argv[++i]) : std::string();
    };
    if (a == "--workload")
      workload = next();
    else if (a == "--mode")
      mode = next();
    else if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--warmup")
      warmup = std::stoi(next());
    else if (a == "--json")
      json_path = next();
    else if (a == "--compression")
      compression = next();
    else if (a == "--device")
      device_name = next();
    else if (a == "--batch")
      batch_arg = std::stoll(next());
    else if (a == "--windows")
      windows = std::stoi(next());
    else if (a == "--sync-bn")
      sync_bn = true;
    else if (a == "--autotune")
      autotune = true;
    else if (a == "--shard")
      shard = std::stoi(next());
    else {
      std::cerr << "usage: train_bench --workload mlp|cnn --mode local|ronde "
                   "[--steps N] [--warmup N] "
                   "[--compression none|fp16|bf16|powersgdR] "
                   "[--device cpu|cuda] [--batch N] [--windows N] [--sync-bn] "
                   "[--autotune] [--json FILE]\n";
      return 2;
    }
  }
  TORCH_CHECK(
      workload == "mlp" || workload == "cnn", "unknown workload ", workload);
  TORCH_CHECK(mode == "local" || mode == "ronde", "unknown mode ", mode);
  TORCH_CHECK(
      device_name == "cpu" || device_name == "cuda",
      "unknown device ",
      device_name);
  TORCH_CHECK(
      device_name == "cpu" || torch::cuda::is_available(),
      "--device cuda, but no CUDA device is available");
  TORCH_CHECK(shard >= 0 && shard <= 2, "--shard must be 0, 1 or 2");
  TORCH_CHECK(shard == 0 || mode == "ronde", "--shard needs --mode ronde");
  TORCH_CHECK(windows >= 1 && steps >= 1, "--steps and --windows must be >= 1");
  // powersgdR: PowerSGD at rank R, compressing from the third step (as
  // DDP's hook, which cannot start earlier), so after the default warmup.
  int64_t powersgd_rank = 0;
  if (compression.rfind("powersgd", 0) == 0)
    powersgd_rank = std::stoll(compression.substr(8));
  TORCH_CHECK(
      compression == "none" || compression == "fp16" || compression == "bf16" ||
          powersgd_rank >= 1,
      "unknown compression ",
      compression);
  const ronde::Compression wire =
      compression == "fp16"   ? ronde::Compression::FP16
      : compression == "bf16" ? ronde::Compression::BF16
                              : ronde::Compression::None;
  at::set_num_threads(1);
  torch::manual_seed(0);
  const bool distributed = mode == "ronde";
  if (distributed)
    ronde::init();
  const int rank = distributed ? ronde::rank() : 0;
  const torch::Device device =
      device_name == "cuda"
          ? (distributed ? ronde::device() : torch::Device(torch::kCUDA, 0))
          : torch::Device(torch::kCPU);
  const bool cuda = device.is_cuda();

  std::shared_ptr<torch::nn::Module> model;
  std::function<torch::Tensor(torch::Tensor)> forward;
  torch::Tensor x, y;
  int64_t batch;
  if (workload == "mlp") {
    auto m = make_mlp();
    model = m.ptr();
    forward = [m](torch::Tensor t) mutable { return m->forward(t); };
    batch = batch_arg > 0 ? batch_arg : 64;
    x = torch::randn({batch, 1024});
    y = torch::randint(0, 1000, {batch});
  } else {
    auto m = ResNet18(sync_bn);
    model = m.ptr();
    forward = [m](torch::Tensor t) mutable { return m->forward(t); };
    batch = batch_arg > 0 ? batch_arg : 32;
    x = torch::randn({batch, 3, 32, 32});
    y = torch::randint(0, 10, {batch});
  }
  model->to(device);
  x = x.to(device);
  y = y.to(device);
  auto base = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  std::unique_ptr<ronde::DistributedOptimizer> dopt;
  torch::optim::Optimizer* opt = base.get();
  if (distributed) {
    ronde::broadcast_parameters(model->named_parameters(), 0);
    dopt = std::make_unique<ronde::DistributedOptimizer>(
        base,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions()
            .compression(wire)
            .comm_hook(
                powersgd_rank > 0
                    ? ronde::powersgd_hook(ronde::PowerSGDOptions()
                                               .rank(powersgd_rank)
                                               .start_iter(2))
                    : nullptr)
            .autotune(autotune)
            .shard_optimizer_state(shard >= 1)
            .shard_gradients(shard >= 2));
    opt = dopt.get();
  }
  std::vector<double> samples, waits;
  // On CUDA: `windows` windows of `steps` steps each, timed between device
  // synchronizations; on the CPU every step is a sample.
  int total = warmup + steps * (cuda ? windows : 1);
  auto window_start = std::chrono::steady_clock::now();
  int64_t bytes_at_warmup = 0;
  // CPU time of each timed step: this (the training) thread's, and that of
  // every other thread of the process (the communication thread's).
  std::vector<double> main_cpus, other_cpus;
  for (int s = 0; s < total; ++s) {
    // Warm-up lasts until the search has chosen: every rank adopts rank
    // 0's choice at the same step, so every rank stops warming up alike.
    if (autotune && dopt && s == warmup && !dopt->bucket_sizing().autotuned &&
        warmup < 400) {
      ++warmup;
      ++total;
    }
    if (dopt && s == warmup)
      bytes_at_warmup = dopt->comm_hook()->bytes_sent();
    if (cuda && s >= warmup && (s - warmup) % steps == 0) {
      torch::cuda::synchronize();
      window_start = std::chrono::steady_clock::now();
    }
    auto t0 = std::chrono::steady_clock::now();
    const double main_cpu0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    const double process_cpu0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    // Gradients stay allocated between steps (no set_to_none) in every mode
    // and in the DDP baseline alike: see benchmarks/README.md on allocator
    // noise.
    if (dopt) {
      dopt->zero_grad(false);
    } else {
      opt->zero_grad(false);
    }
    auto loss = torch::cross_entropy_loss(forward(x), y);
    loss.backward();
    opt->step();
    // The host's wait for the all-reduces in step() (on CUDA: for them to
    // be queued, since step() does not wait for the device).
    if (dopt && s >= warmup)
      waits.push_back(dopt->last_step_profile().wait_seconds);
    if (s >= warmup) {
      const double main = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - main_cpu0;
      main_cpus.push_back(main);
      other_cpus.push_back(
          cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process_cpu0 - main);
    }
    if (cuda) {
      if (s >= warmup && (s - warmup) % steps == steps - 1) {
        torch::cuda::synchronize();
        samples.push_back(
            std::chrono::duration<double>(
                std::chrono::steady_clock::now() - window_start)
                .count() /
            steps);
      }
      continue;
    }
    double dt =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (s >= warmup)
      samples.push_back(dt);
  }
  double main_cpu = median(main_cpus);
  double other_cpu = median(other_cpus);
  double step = median(samples);
  double wait = waits.empty() ? 0 : median(waits);
  if (distributed) {
    auto t = torch::tensor({step, wait}, torch::kDouble);
    ronde::allreduce_(t, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
    step = t[0].item<double>();
    wait = t[1].item<double>();
    // CPU time: the mean over the ranks.
    auto c = torch::tensor({main_cpu, other_cpu}, torch::kDouble);
    ronde::allreduce_(
        c, ronde::AllreduceOptions().op(ronde::ReduceOp::Average));
    main_cpu = c[0].item<double>();
    other_cpu = c[1].item<double>();
  }
  const int world = distributed ? ronde::size() : 1;
  // Gradient bytes each rank put into its collectives per measured step,
  // by the hook's own count.
  const int64_t wire_bytes =
      dopt ? (dopt->comm_hook()->bytes_sent() - bytes_at_warmup) /
                 (total - warmup)
           : 0;
  if (rank == 0) {
    std::printf(
        "%s%s %s on %s (compression %s): %d rank(s), median step %.3f ms, "
        "%.1f samples/s, comm wait %.1f ms, CPU per step %.1f ms training "
        "thread + %.1f ms other threads\n",
        workload.c_str(),
        sync_bn ? " (SyncBatchNorm)" : "",
        mode.c_str(),
        device_name.c_str(),
        compression.c_str(),
        world,
        step * 1e3,
        world * batch / step,
        wait * 1e3,
        main_cpu * 1e3,
        other_cpu * 1e3);
    if (!json_path.empty()) {
      std::ofstream json(json_path);
      json << "{\"workload\":\"" << workload << "\",\"mode\":\"" << mode
           << "\",\"device\":\"" << device_name << "\",\"compression\":\""
           << compression << "\",\"ranks\":" << world
           << ",\"batch_per_rank\":" << batch << ",\"step_s\":" << step
           << ",\"wait_s\":" << wait << ",\"main_cpu_s\":" << main_cpu
           << ",\"other_cpu_s\":" << other_cpu
           << ",\"samples_per_s\":" << world * batch / step
           << ",\"steps\":" << steps << ",\"wire_bytes\":" << wire_bytes
           << ",\"sync_bn\":" << (sync_bn ? "true" : "false")
           << ",\"shard\":" << shard;
      if (dopt) {
        const ronde::BucketSizing b = dopt->bucket_sizing();
        json << ",\"bucket_mb\":" << b.fusion_threshold_mb
             << ",\"first_bucket_mb\":" << b.first_bucket_mb
             << ",\"autotune\":" << (autotune ? "true" : "false")
             << ",\"autotuned\":" << (b.autotuned ? "true" : "false")
             << ",\"warmup_steps\":" << warmup;
      }
      json << "}\n";
    }
  }
  if (distributed)
    ronde::shutdown();
  return 0;
}
