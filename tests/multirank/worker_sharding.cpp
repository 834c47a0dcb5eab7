// Scenarios of sharded optimizer state (ZeRO stages 1 and 2): every rank
// trains the same model twice, once unsharded (itself equal to one process,
// see worker_optim.cpp) and once sharded, on the same batches; over shared
// memory the two must agree bit for bit after every step. Checkpoints move
// between sharded and unsharded jobs and between rank counts.
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_optim_common.h"

#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace ronde::testing;

// Small buckets, so that parameters straddle ranks and buckets.
ronde::DistributedOptimizerOptions small_buckets() {
  return ronde::DistributedOptimizerOptions()
      .fusion_threshold_mb(0.002)
      .first_bucket_mb(0.001);
}

struct Replica {
  Net net;
  std::unique_ptr<ronde::DistributedOptimizer> opt;
};

Replica make_replica(
    const std::string& optimizer,
    bool two_groups,
    bool use_extra,
    ronde::DistributedOptimizerOptions o) {
  Replica r{make_net(use_extra), nullptr};
  r.opt = std::make_unique<ronde::DistributedOptimizer>(
      make_optimizer(optimizer, r.net, two_groups),
      r.net->named_parameters(),
      o);
  return r;
}

// The rank's batch of step s.
std::pair<torch::Tensor, torch::Tensor> batch(int s) {
  const int n = ronde::size(), r = ronde::rank();
  torch::manual_seed(1000 + s);
  torch::Tensor X = torch::randn({n * 4, 8}, torch::kDouble);
  torch::Tensor Y = torch::randn({n * 4, 4}, torch::kDouble);
  return {X.narrow(0, r * 4, 4), Y.narrow(0, r * 4, 4)};
}

bool same_params(Replica& a, Replica& b) {
  return torch::equal(params_flat(*a.net), params_flat(*b.net));
}

// Over shared memory both reduce in rank order: equal bit for bit. Over
// Gloo (RONDE_SHM=0) the reduce-scatter's order of summation is not the
// all-reduce's: equal within rounding.
bool agree(Replica& a, Replica& b) {
  const char* shm = std::getenv("RONDE_SHM");
  if (shm == nullptr || std::string(shm) != "0")
    return same_params(a, b);
  return torch::allclose(params_flat(*a.net), params_flat(*b.net), 1e-9, 1e-12);
}

// optimizer, variant: plain | groups | bpps2 | unused | clip | amp | warmup
// | stage2 | zerocopy (every bucket in the shared-memory arena, whatever
// its size: the reduce-scatter reads every rank's where it lies) |
// stage2_partial (the extra layer used on every other rank in turn: stage
// 2's kept staging buffers must not carry an earlier step's gradient into
// it) | stage1_fp16, stage2_fp16 (fp16 wires on both replicas: kept wire
// buffers must carry each step's gradients) | per_param, stage2_per_param
// (a bucket per parameter: an unpadded one is gathered straight into its
// parameter, the others through the gather buffers).
int scenario_zero(const std::string& optimizer, const std::string& variant) {
  const bool stage2 = variant.rfind("stage2", 0) == 0;
  const bool partial = variant == "stage2_partial";
  if (variant == "zerocopy")  // read once, at init()
    ::setenv("RONDE_SHM_ZERO_COPY_BYTES", "0", 1);
  ronde::init();
  const int n = ronde::size();
  const bool unused = variant == "unused";
  const int64_t k = variant == "bpps2" ? 2 : 1;
  auto o = small_buckets().backward_passes_per_step(k);
  if (variant == "per_param" || variant == "stage2_per_param")
    o.fusion_threshold_mb(0.0001).first_bucket_mb(0.0001);
  if (variant == "stage1_fp16" || variant == "stage2_fp16")
    o.compression(ronde::Compression::FP16);
  Replica plain = make_replica(optimizer, variant == "groups", !unused, o);
  Replica shard = make_replica(
      optimizer,
      variant == "groups",
      !unused,
      stage2 ? o.shard_gradients(true) : o.shard_optimizer_state(true));
  CHECK_W(shard.opt->sharded() && !plain.opt->sharded(), "sharded()");
  std::vector<std::unique_ptr<ronde::WarmupScheduler>> scheds;
  std::vector<std::unique_ptr<ronde::GradScaler>> scalers;
  for (Replica* m : {&plain, &shard}) {
    if (variant == "warmup") {
      scheds.push_back(std::make_unique<ronde::WarmupScheduler>(
          *m->opt, ronde::WarmupOptions().warmup_steps(3)));
    }
    if (variant == "amp") {
      scalers.push_back(std::make_unique<ronde::GradScaler>(
          ronde::GradScalerOptions().init_scale(256).growth_interval(2)));
    }
  }
  for (int s = 0; s < 8; ++s) {
    int which = 0;
    for (Replica* m : {&plain, &shard}) {
      if (partial)
        m->net->use_extra_ = (ronde::rank() + s) % 2 == 0;
      m->opt->zero_grad();
      for (int64_t pass = 0; pass < k; ++pass) {
        auto [x, y] = batch(s * 2 + static_cast<int>(pass));
        torch::Tensor loss = torch::mse_loss(m->net->forward(x), y);
        if (variant == "amp") {
          // The last rank overflows at step 3: every rank skips it.
          if (s == 3 && ronde::rank() == n - 1)
            loss = loss * std::numeric_limits<double>::infinity();
          scalers[which]->scale(loss).backward();
        } else {
          loss.backward();
        }
      }
      if (variant == "amp") {
        const bool stepped = scalers[which]->step(*m->opt);
        scalers[which]->update();
        CHECK_W(stepped == (s != 3), "step ", s, " stepped=", stepped);
      } else {
        if (variant == "clip") {
          const double norm = ronde::clip_grad_norm_(*m->opt, 0.05);
          CHECK_W(norm > 0.05, "step ", s, ": norm ", norm, " is not clipped");
        }
        m->opt->step();
      }
      if (variant == "warmup")
        scheds[which]->step();
      ++which;
    }
    CHECK_W(
        agree(plain, shard),
        "step ",
        s,
        ": the sharded replica differs from the unsharded one");
  }
  check_replicas_identical(params_flat(*shard.net));
  // The state is split, not copied: the ranks' shards add up to the
  // unsharded state, and each holds about 1/N of it.
  const int64_t mine = shard.opt->optimizer_state_bytes();
  const int64_t whole = plain.opt->optimizer_state_bytes();
  auto sum = ronde::allreduce(
      torch::tensor({mine}, torch::kLong),
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(
      sum.item<int64_t>() == whole,
      "the shards hold ",
      sum.item<int64_t>(),
      " bytes of state, the unsharded optimizer ",
      whole);
  CHECK_W(
      n == 1 || mine < whole,
      "rank holds ",
      mine,
      " bytes of state of ",
      whole);
  ronde::shutdown();
  return scenario_exit_code();
}

RONDE_SCENARIO(zero) {
  return scenario_zero(argv[2], argv[3]);
}

// An optimizer that needs whole tensors is refused, naming it.
RONDE_SCENARIO(zero_refused) {
  ronde::init();
  Net net = make_net(true);
  try {
    ronde::DistributedOptimizer opt(
        make_optimizer("lbfgs", net, false),
        net->named_parameters(),
        ronde::DistributedOptimizerOptions().shard_optimizer_state(true));
    CHECK_W(false, "LBFGS was sharded");
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    CHECK_W(what.find("LBFGS") != std::string::npos, "message: ", what);
  }
  ronde::shutdown();
  return scenario_exit_code();
}

void train_steps(Replica& m, int from, int to) {
  for (int s = from; s < to; ++s) {
    m.opt->zero_grad();
    auto [x, y] = batch(s);
    torch::mse_loss(m.net->forward(x), y).backward();
    m.opt->step();
  }
}

// zero_ckpt <dir> save: trains sharded (Adam) 3 steps and saves; an
//   unsharded replica restored from that file then trains beside the
//   sharded one, equal bit for bit, and saves step 6 into <dir>/plain.
// zero_ckpt <dir> resume (another rank count): a sharded and an unsharded
//   replica restored from <dir> train 3 more steps together, and so do a
//   sharded and an unsharded one restored from <dir>/plain, equal bit for
//   bit.
RONDE_SCENARIO(zero_ckpt) {
  ronde::init();
  const std::string dir = argv[2], phase = argv[3];
  auto sharded = small_buckets().shard_optimizer_state(true);
  if (phase == "save") {
    Replica a = make_replica("adam", true, true, sharded);
    train_steps(a, 0, 3);
    ronde::Checkpointer ca(dir, 0);
    ca.add("model", *a.net).add("optimizer", *a.opt);
    ca.save(3);
    Replica b = make_replica("adam", true, true, small_buckets());
    ronde::Checkpointer cb(dir, 0);
    cb.add("model", *b.net).add("optimizer", *b.opt);
    CHECK_W(cb.restore() == 3, "restore");
    for (int s = 3; s < 6; ++s) {
      train_steps(a, s, s + 1);
      train_steps(b, s, s + 1);
      CHECK_W(same_params(a, b), "step ", s, ": unsharded resume differs");
    }
    ronde::Checkpointer cp(dir + "/plain", 0);
    cp.add("model", *b.net).add("optimizer", *b.opt);
    cp.save(6);
  } else {
    Replica a = make_replica("adam", true, true, sharded);
    Replica b = make_replica("adam", true, true, small_buckets());
    Replica c = make_replica("adam", true, true, sharded);
    Replica d = make_replica("adam", true, true, small_buckets());
    ronde::Checkpointer ca(dir, 0), cb(dir, 0);
    ronde::Checkpointer cc(dir + "/plain", 0), cd(dir + "/plain", 0);
    ca.add("model", *a.net).add("optimizer", *a.opt);
    cb.add("model", *b.net).add("optimizer", *b.opt);
    cc.add("model", *c.net).add("optimizer", *c.opt);
    cd.add("model", *d.net).add("optimizer", *d.opt);
    CHECK_W(ca.restore() == 3 && cb.restore() == 3, "restore");
    CHECK_W(cc.restore() == 6 && cd.restore() == 6, "restore plain");
    for (int s = 3; s < 6; ++s) {
      train_steps(a, s, s + 1);
      train_steps(b, s, s + 1);
      CHECK_W(same_params(a, b), "step ", s, ": sharded resume differs");
    }
    for (int s = 6; s < 9; ++s) {
      train_steps(c, s, s + 1);
      train_steps(d, s, s + 1);
      CHECK_W(
          same_params(c, d), "step ", s, ": sharded from unsharded differs");
    }
  }
  ronde::shutdown();
  return scenario_exit_code();
}

}  // namespace
