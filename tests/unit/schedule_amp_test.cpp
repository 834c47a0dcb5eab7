// Single-process tests of LR scaling, warmup/decay schedules (against their
// closed forms), global batch arithmetic, the distributed sampler's
// sharding, GradScaler's scale trajectory and autocast.
#include <ronde/ronde.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>

namespace {

using ronde::Decay;
using ronde::LrScaling;
using ronde::WarmupOptions;
using ronde::WarmupShape;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(LrScaling, Factors) {
  EXPECT_DOUBLE_EQ(ronde::lr_scale_factor(LrScaling::None, 8, 2), 1.0);
  EXPECT_DOUBLE_EQ(ronde::lr_scale_factor(LrScaling::Linear, 4, 2), 8.0);
  EXPECT_DOUBLE_EQ(ronde::lr_scale_factor(LrScaling::Sqrt, 4, 4), 4.0);
  EXPECT_DOUBLE_EQ(ronde::scale_lr(0.1, LrScaling::Linear), 0.1);  // 1 replica
  EXPECT_NE(
      error_of([] {
        ronde::lr_scale_factor(LrScaling::Linear, 0);
      }).find("replicas must be >= 1"),
      std::string::npos);
}

TEST(Schedule, WarmupShapesMatchClosedForms) {
  const double k = 4;
  auto o = WarmupOptions().warmup_steps(10);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 0), 0.25);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 5), (1 + 3 * 0.5) / 4);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 10), 1.0);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 1000), 1.0);
  o.shape(WarmupShape::Exponential);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 0), 0.25);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 5), 0.5);
  o.shape(WarmupShape::Constant);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 9), 0.25);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, k, 10), 1.0);
}

TEST(Schedule, DecaysMatchClosedForms) {
  auto o = WarmupOptions().warmup_steps(2);
  o.then(Decay::step(3, 0.5));
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, 1, 2 + 2), 1.0);
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, 1, 2 + 7), 0.25);
  o.then(Decay::multi_step({2, 5}, 0.1));
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, 1, 2 + 1), 1.0);
  EXPECT_NEAR(ronde::schedule_factor(o, 1, 2 + 2), 0.1, 1e-15);
  EXPECT_NEAR(ronde::schedule_factor(o, 1, 2 + 6), 0.01, 1e-15);
  o.then(Decay::cosine(10, 0.1));
  EXPECT_DOUBLE_EQ(ronde::schedule_factor(o, 1, 2), 1.0);
  EXPECT_NEAR(ronde::schedule_factor(o, 1, 2 + 5), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(ronde::schedule_factor(o, 1, 2 + 10), 0.1, 1e-12);
  EXPECT_NEAR(ronde::schedule_factor(o, 1, 2 + 50), 0.1, 1e-12);
  o.then(Decay::polynomial(10, 2.0));
  EXPECT_NEAR(ronde::schedule_factor(o, 1, 2 + 5), 0.25, 1e-12);
  EXPECT_NEAR(ronde::schedule_factor(o, 1, 2 + 10), 0.0, 1e-12);
}

torch::optim::SGD two_group_sgd(torch::Tensor& a, torch::Tensor& b) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>{a},
      std::make_unique<torch::optim::SGDOptions>(0.1));
  groups.emplace_back(
      std::vector<torch::Tensor>{b},
      std::make_unique<torch::optim::SGDOptions>(0.2));
  return torch::optim::SGD(groups, torch::optim::SGDOptions(0.1));
}

TEST(WarmupScheduler, ActsOnEveryGroupKeepingRatiosAndResumes) {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({2}, torch::requires_grad());
  auto opt = two_group_sgd(a, b);
  auto o =
      WarmupOptions().warmup_steps(4).multiplier(4).then(Decay::step(2, 0.5));
  ronde::WarmupScheduler sched(opt, o);
  EXPECT_NEAR(sched.current_lrs()[0], 0.025, 1e-15);
  EXPECT_NEAR(sched.current_lrs()[1], 0.05, 1e-15);
  sched.step();
  sched.step();
  EXPECT_NEAR(sched.current_lrs()[0], 0.1 * (1 + 3 * 0.5) / 4, 1e-15);
  EXPECT_NEAR(sched.current_lrs()[1] / sched.current_lrs()[0], 2.0, 1e-12);
  torch::serialize::OutputArchive out;
  sched.save(out);
  for (int i = 0; i < 4; ++i)
    sched.step();  // t = 6: one decay
  EXPECT_NEAR(sched.current_lrs()[0], 0.05, 1e-15);
  std::stringstream ss;
  out.save_to(ss);

  auto a2 = torch::zeros({2}, torch::requires_grad());
  auto b2 = torch::zeros({2}, torch::requires_grad());
  auto opt2 = two_group_sgd(a2, b2);
  // A fresh scheduler on an optimizer whose LRs were changed meanwhile:
  // load() restores the peak LRs and the step.
  opt2.param_groups()[0].options().set_lr(9);
  ronde::WarmupScheduler resumed(
      opt2,
      WarmupOptions().warmup_steps(4).multiplier(4).then(Decay::step(2, 0.5)));
  torch::serialize::InputArchive in;
  in.load_from(ss);
  resumed.load(in);
  EXPECT_EQ(resumed.step_count(), 2);
  EXPECT_NEAR(resumed.current_lrs()[0], 0.1 * (1 + 3 * 0.5) / 4, 1e-15);
  for (int i = 0; i < 4; ++i)
    resumed.step();
  EXPECT_NEAR(resumed.current_lrs()[0], 0.05, 1e-15);
  EXPECT_NEAR(resumed.current_lrs()[1], 0.1, 1e-15);
}

TEST(GlobalBatch, DerivedFromPerReplica) {
  EXPECT_EQ(ronde::GlobalBatch::per_replica(32, 2).global_batch(), 64);
  EXPECT_EQ(ronde::GlobalBatch::global(64, 2).per_replica_batch(), 32);
  EXPECT_NE(
      error_of([] {
        ronde::GlobalBatch::global(30, 4);
      }).find("global batch 30 does not divide into 1 replicas x 4"),
      std::string::npos);
  EXPECT_NE(
      error_of([] {
        ronde::GlobalBatch::per_replica(0);
      }).find("per-replica batch must be >= 1"),
      std::string::npos);
}

std::vector<size_t> drain(ronde::DistributedSampler& s, size_t batch) {
  std::vector<size_t> all;
  while (auto b = s.next(batch))
    all.insert(all.end(), b->begin(), b->end());
  return all;
}

TEST(DistributedSampler, ShardsAreDisjointAndCoverTheDataset) {
  for (bool drop_last : {false, true}) {
    const size_t n = 103;
    const int replicas = 4;
    std::multiset<size_t> seen;
    size_t per_rank = 0;
    for (int r = 0; r < replicas; ++r) {
      ronde::DistributedSampler s(
          n,
          ronde::DistributedSamplerOptions()
              .rank(r)
              .replicas(replicas)
              .seed(7)
              .drop_last(drop_last));
      auto idx = drain(s, 10);
      if (r == 0)
        per_rank = idx.size();
      EXPECT_EQ(idx.size(), per_rank) << "every rank runs the same steps";
      seen.insert(idx.begin(), idx.end());
    }
    if (drop_last) {
      EXPECT_EQ(seen.size(), 100u);
      EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), 100u);
    } else {
      EXPECT_EQ(seen.size(), 104u);  // padded by one repeated sample
      EXPECT_EQ(std::set<size_t>(seen.begin(), seen.end()).size(), n);
    }
  }
}

TEST(DistributedSampler, ReshufflesPerEpochAndResumes) {
  auto opts = ronde::DistributedSamplerOptions().rank(1).replicas(2).seed(3);
  ronde::DistributedSampler a(50, opts), b(50, opts);
  EXPECT_EQ(a.indices(), b.indices());
  auto epoch0 = a.indices();
  a.set_epoch(1);
  EXPECT_NE(a.indices(), epoch0);
  a.next(7);
  torch::serialize::OutputArchive out;
  a.save(out);
  std::stringstream ss;
  out.save_to(ss);
  torch::serialize::InputArchive in;
  in.load_from(ss);
  b.load(in);
  EXPECT_EQ(b.epoch(), 1);
  // b splits the rest of the epoch from where the job stood: 7 samples
  // read by each of 2 ranks.
  EXPECT_EQ(b.consumed(), 14u);
  EXPECT_EQ(b.position(), 0u);
  EXPECT_EQ(*b.next(5), *a.next(5));
  EXPECT_EQ(a.consumed(), b.consumed());
}

// The world changes within an epoch: the rest of the permutation is split
// over the new ranks, and over the epoch every sample is read once.
TEST(DistributedSampler, SplitsTheRestOfTheEpochOverANewWorld) {
  const size_t n = 48;
  std::vector<int> seen(n, 0);
  std::vector<std::unique_ptr<ronde::DistributedSampler>> four;
  for (int r = 0; r < 4; ++r) {
    four.push_back(std::make_unique<ronde::DistributedSampler>(
        n, ronde::DistributedSamplerOptions().rank(r).replicas(4).seed(5)));
  }
  for (int step = 0; step < 3; ++step) {
    for (auto& s : four) {
      const auto batch = s->next(2);  // kept: the loop reads into it
      for (size_t i : *batch)
        ++seen[i];
    }
  }
  EXPECT_EQ(four[0]->consumed(), 24u);
  torch::serialize::OutputArchive out;
  four[0]->save(out);
  std::stringstream saved;
  out.save_to(saved);
  const std::string bytes = saved.str();
  for (int r = 0; r < 3; ++r) {
    ronde::DistributedSampler s(
        n, ronde::DistributedSamplerOptions().rank(r).replicas(3).seed(5));
    std::istringstream ss(bytes);
    torch::serialize::InputArchive in;
    in.load_from(ss);
    s.load(in);
    EXPECT_EQ(s.epoch(), 0);
    EXPECT_EQ(s.num_samples(), 8u);
    while (auto batch = s.next(2)) {
      for (size_t i : *batch)
        ++seen[i];
    }
    EXPECT_EQ(s.consumed(), n);
  }
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(seen[i], 1) << "sample " << i;
}

TEST(GradScaler, ScaleTrajectoryFollowsTheRule) {
  auto w = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.5));
  ronde::GradScaler scaler(
      ronde::GradScalerOptions().init_scale(1024).growth_interval(2));
  // clean, clean (grow), overflow (back off, skip), clean, overflow, clean,
  // clean (grow)
  std::vector<bool> overflow = {false, false, true, false, true, false, false};
  std::vector<double> want = {1024, 2048, 1024, 1024, 512, 512, 1024};
  for (size_t i = 0; i < overflow.size(); ++i) {
    opt.zero_grad();
    auto before = w.detach().clone();
    auto loss = (w * 2).sum();
    if (overflow[i])
      loss = loss * std::numeric_limits<float>::infinity();
    scaler.scale(loss).backward();
    if (overflow[i]) {
      EXPECT_TRUE(std::isinf(w.grad()[0].item<double>())) << i;
    } else {
      EXPECT_NEAR(w.grad()[0].item<double>(), 2 * scaler.get_scale(), 1e-3)
          << i;
    }
    bool stepped = scaler.step(opt);
    EXPECT_EQ(stepped, !overflow[i]) << i;
    if (stepped) {
      // The gradient was unscaled to 2 before the step.
      EXPECT_TRUE(torch::allclose(w.detach(), before - 0.5 * 2)) << i;
    } else {
      EXPECT_TRUE(torch::equal(w.detach(), before)) << i;
    }
    scaler.update();
    EXPECT_DOUBLE_EQ(scaler.get_scale(), want[i]) << "after step " << i;
  }
}

TEST(GradScaler, EarlyUnscaleForClippingIsNotRepeated) {
  auto w = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
  ronde::GradScaler scaler(ronde::GradScalerOptions().init_scale(256));
  scaler.scale((w * 3).sum()).backward();
  scaler.unscale(opt);
  EXPECT_NEAR(w.grad()[0].item<double>(), 3.0, 1e-6);
  torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{w}, 1.0);
  scaler.step(opt);
  // Clipped to norm 1 (0.5 each), not unscaled a second time.
  EXPECT_NEAR(w[0].item<double>(), 0.5, 1e-5);
  EXPECT_NE(
      error_of([&] { scaler.step(opt); }).find("step() called twice"),
      std::string::npos);
}

TEST(Autocast, GuardCastsAndRestores) {
  auto a = torch::randn({8, 8});
  {
    ronde::AutocastGuard guard(torch::kCPU);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
}

TEST(Autocast, Bf16TrainingConvergesOnASmallProblem) {
  torch::manual_seed(0);
  auto X = torch::randn({256, 16});
  auto w_true = torch::randn({16, 1});
  auto Y = torch::mm(X, w_true);
  torch::nn::Linear model(16, 1);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  ronde::GradScaler scaler(
      ronde::GradScalerOptions().enabled(false));  // bf16: no scaling
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    torch::Tensor pred;
    {
      ronde::AutocastGuard guard(torch::kCPU);
      pred = model->forward(X);
      EXPECT_EQ(pred.scalar_type(), torch::kBFloat16);
    }
    // The loss in float32, outside autocast.
    auto loss = torch::mse_loss(pred.to(torch::kFloat), Y);
    if (step == 0)
      first = loss.item<double>();
    last = loss.item<double>();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
  EXPECT_LT(last, 0.01 * first) << "first " << first << " last " << last;
}

}  // namespace
