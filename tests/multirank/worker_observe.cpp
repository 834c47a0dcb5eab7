// What a user sees of a run from outside: ronde's ranges in a PyTorch
// (Kineto) profiler trace, and TrainingMonitor's resource figures, checked
// on every rank against what the process itself reads.
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

// A field of /proc/self/status ("VmRSS", "VmHWM") in MiB; -1 if absent.
double proc_status_mb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(field + ":", 0) == 0)
      return std::stod(line.substr(field.size() + 1)) / 1024.0;  // kB
  }
  return -1;
}

struct Model : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  Model() {
    a = register_module("a", torch::nn::Linear(32, 64));
    b = register_module("b", torch::nn::Linear(64, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return b(torch::tanh(a(x)));
  }
};

// SGD behind small buckets: several all-reduces per step.
std::unique_ptr<ronde::DistributedOptimizer> small_bucket_sgd(Model& model) {
  return std::make_unique<ronde::DistributedOptimizer>(
      std::make_shared<torch::optim::SGD>(
          model.parameters(), torch::optim::SGDOptions(0.1)),
      model.named_parameters(),
      ronde::DistributedOptimizerOptions()
          .fusion_threshold_mb(0.004)
          .first_bucket_mb(0.004));
}

// Three steps and a checkpoint under a CPU profiler (what
// torch.profiler.profile() does from Python); the trace goes to
// dir/trace.<rank>.json.
int scenario_profiler(const std::string& dir) {
  ronde::init();
  const int rank = ronde::rank();
  torch::manual_seed(3);
  auto model = std::make_shared<Model>();
  ronde::broadcast_parameters(model->named_parameters(), 0);
  auto opt = small_bucket_sgd(*model);
  ronde::Checkpointer ckpt(dir + "/ckpt", 1);
  ckpt.add("model", *model);

  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  const std::set<impl::ActivityType> cpu{impl::ActivityType::CPU};
  prof::prepareProfiler(config, cpu);
  prof::enableProfiler(config, cpu);
  for (int step = 0; step < 3; ++step) {
    opt->zero_grad();
    torch::Tensor x, y;
    {
      ronde::TimelineRange data("load batch");
      x = torch::randn({16, 32});
      y = torch::randn({16, 8});
    }
    torch::mse_loss(model->forward(x), y).backward();
    opt->step();
  }
  ckpt.save(3);
  auto result = prof::disableProfiler();
  const std::string path = dir + "/trace." + std::to_string(rank) + ".json";
  result->save(path);

  // Which thread each range ran on, from the profiler's own events.
  std::map<std::string, std::set<uint64_t>> threads;
  for (const auto& e : result->events())
    threads[e.name()].insert(e.startThreadId());
  for (const char* name :
       {"ronde::launch",
        "ronde::pack",
        "ronde::allreduce",
        "ronde::wait",
        "ronde::unpack",
        "ronde::step",
        "ronde::checkpoint_save",
        "load batch"}) {
    CHECK_W(threads.count(name) == 1, "no '", name, "' range in the trace");
  }
  // The all-reduces ran on ronde's communication thread, the step on the
  // training thread: both threads are in the trace.
  if (threads.count("ronde::allreduce") && threads.count("ronde::step")) {
    for (uint64_t t : threads["ronde::allreduce"])
      CHECK_W(
          threads["ronde::step"].count(t) == 0,
          "an all-reduce range on the training thread");
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  CHECK_W(
      text.str().find("\"ronde::allreduce\"") != std::string::npos,
      "the saved trace lacks the all-reduce ranges");

  // No profiler: the same calls record nothing anywhere.
  auto before = result->events().size();
  opt->zero_grad();
  torch::mse_loss(model->forward(torch::randn({16, 32})), torch::randn({16, 8}))
      .backward();
  opt->step();
  CHECK_W(result->events().size() == before, "events after the profiler");
  std::cout << "PROFILER events " << before << " on rank " << rank << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// TrainingMonitor's resource figures beside /proc/self/status: rank 1
// holds 64 MiB more than rank 0, so mean and max differ.
int scenario_monitor_resources(const std::string& dir) {
  ronde::init();
  const int rank = ronde::rank();
  std::vector<char> ballast(rank == 1 ? 64u << 20 : 0, 1);
  std::ostringstream out;
  ronde::TrainingMonitor monitor(
      ronde::MonitorOptions()
          .log_every(2)
          .epochs(1)
          .steps_per_epoch(4)
          .metrics_out(dir + "/metrics.jsonl"),
      out);
  monitor.start_epoch();
  auto a = torch::randn({256, 256});
  for (int step = 0; step < 4; ++step) {
    for (int i = 0; i < 20; ++i)
      a = torch::tanh(a.mm(a) / 256);  // CPU work for the window
    monitor.step(1.0, 16);
  }
  const ronde::ResourceStats r = monitor.last_progress().resources;
  const double rss = proc_status_mb("VmRSS");
  const double hwm = proc_status_mb("VmHWM");
  CHECK_W(
      r.cpu_percent > 5 && r.cpu_percent_max >= r.cpu_percent,
      "cpu ",
      r.cpu_percent,
      " max ",
      r.cpu_percent_max);
  CHECK_W(
      r.rss_mb > 10 && r.rss_mb_max >= r.rss_mb,
      "rss ",
      r.rss_mb,
      " max ",
      r.rss_mb_max);
  // Mean and max over the two ranks: rank 1's ballast shows in the max.
  CHECK_W(
      r.rss_mb_max - r.rss_mb > 20, "mean ", r.rss_mb, " max ", r.rss_mb_max);
  // This process's own figure is within the spread of the ranks' figures.
  CHECK_W(
      rss <= r.rss_mb_max + 8 && rss >= 2 * r.rss_mb - r.rss_mb_max - 8,
      "VmRSS ",
      rss,
      " against mean ",
      r.rss_mb,
      " max ",
      r.rss_mb_max);
  CHECK_W(r.peak_rss_mb >= r.rss_mb_max - 1, "peak ", r.peak_rss_mb);
  CHECK_W(
      rank == 0 || r.peak_rss_mb <= hwm + 1,
      "peak ",
      r.peak_rss_mb,
      " VmHWM ",
      hwm);
  CHECK_W(!r.cuda, "CUDA figures in a CPU job");
  volatile char kept = ballast.empty() ? 0 : ballast[ballast.size() / 2];
  (void)kept;
  const ronde::EpochStats e = monitor.end_epoch({{"val_acc", 0.5}});
  CHECK_W(
      e.resources.rss_mb > 10 && e.resources.cpu_percent > 5,
      "epoch rss ",
      e.resources.rss_mb,
      " cpu ",
      e.resources.cpu_percent);
  if (rank == 0) {
    const std::string text = out.str();
    CHECK_W(
        text.find("% rss ") == std::string::npos &&
            text.find("  cpu ") != std::string::npos &&
            text.find(" MiB (peak ") != std::string::npos,
        text);
    std::cout << text;
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Which threads ran "ronde::allreduce" ranges: the scenario's own (the
// waiter) or another (the communication thread).
std::thread::id g_waiter;
std::atomic<int> g_on_waiter{0}, g_elsewhere{0};

std::unique_ptr<at::ObserverContext> count_allreduce(
    const at::RecordFunction& fn) {
  if (std::string_view(fn.name()) == "ronde::allreduce")
    ++(std::this_thread::get_id() == g_waiter ? g_on_waiter : g_elsewhere);
  return nullptr;
}

// Asynchronous all-reduces waited on at once run on the waiting thread
// when the communication thread is idle (CommWorker::help), with the
// right results, as long as they are within RONDE_HELP_BYTES; the optimizer's
// buckets (communication hook tasks) never do, and still overlap on the
// communication thread.
int scenario_waiter_helps() {
  ronde::init();
  const int rank = ronde::rank(), n = ronde::size();
  g_waiter = std::this_thread::get_id();
  auto callback =
      at::addGlobalCallback(at::RecordFunctionCallback(&count_allreduce)
                                .scopes({at::RecordScope::USER_SCOPE}));
  const int calls = 200;
  for (int i = 0; i < calls; ++i) {
    torch::Tensor t = torch::full({1024}, static_cast<float>(rank + i));
    ronde::allreduce_async_(
        t, ronde::AllreduceOptions().op(ronde::ReduceOp::Sum))
        .wait();
    const float want = static_cast<float>(n * i + n * (n - 1) / 2);
    CHECK_W(
        t.eq(want).all().item<bool>(),
        "call ",
        i,
        ": ",
        t[0].item<float>(),
        " != ",
        want);
  }
  const int helped = g_on_waiter.load();
  std::cout << "HELPED " << helped << " of " << calls << " on rank " << rank
            << std::endl;
  CHECK_W(helped > 0, "no queued all-reduce ran on the waiting thread");
  // Above RONDE_HELP_BYTES (8 KiB, set by the test) the communication
  // thread runs every one.
  for (int i = 0; i < 50; ++i) {
    torch::Tensor t = torch::full({4096}, static_cast<float>(rank + i));
    ronde::allreduce_async_(
        t, ronde::AllreduceOptions().op(ronde::ReduceOp::Sum))
        .wait();
    const float want = static_cast<float>(n * i + n * (n - 1) / 2);
    CHECK_W(t.eq(want).all().item<bool>(), "16 KiB call ", i);
  }
  CHECK_W(
      g_on_waiter.load() == helped,
      g_on_waiter.load() - helped,
      " all-reduces above RONDE_HELP_BYTES ran on the waiting thread");

  torch::manual_seed(3);
  auto model = std::make_shared<Model>();
  auto opt = small_bucket_sgd(*model);
  g_elsewhere = 0;
  for (int step = 0; step < 5; ++step) {
    opt->zero_grad();
    torch::mse_loss(
        model->forward(torch::randn({16, 32})), torch::randn({16, 8}))
        .backward();
    opt->step();
  }
  at::removeCallback(callback);
  CHECK_W(g_elsewhere.load() > 0, "no bucket all-reduce was seen");
  CHECK_W(
      g_on_waiter.load() == helped,
      g_on_waiter.load() - helped,
      " bucket all-reduces ran on the training thread");
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

RONDE_SCENARIO(waiter_helps) {
  return scenario_waiter_helps();
}

RONDE_SCENARIO(profiler) {
  return scenario_profiler(argc > 2 ? argv[2] : "/tmp");
}

RONDE_SCENARIO(monitor_resources) {
  return scenario_monitor_resources(argc > 2 ? argv[2] : "/tmp");
}

}  // namespace
