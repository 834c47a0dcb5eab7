// Data-parallel training of a small CNN on Fashion-MNIST, the example to start
// from:
//
//   ronderun -np 2 -- fashion_mnist            # 2 ranks, 3 epochs, ~90% test
//   accuracy ronderun -np 4 -- fashion_mnist --global-batch 128 --metrics-out
//   m.jsonl
//
// Every rank reads its own shard of the training set (DistributedSampler),
// starts from rank 0's weights (broadcast_parameters), and steps SGD on
// gradients averaged over ranks (DistributedOptimizer). The LR grows with the
// global batch (LrScaling::Linear) after a warmup from the single-replica LR,
// then follows a cosine decay. Only rank 0 prints.
#include "common/classifier.h"
#include "common/flags.h"
#include "common/scaled_fp16_hook.h"

#include <ronde/ronde.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

namespace {

// --comm-hook: one of ronde's hooks, or this example's own.
std::shared_ptr<ronde::CommHook> make_hook(
    const std::string& name, int64_t powersgd_rank, int64_t powersgd_start) {
  if (name == "allreduce")
    return ronde::allreduce_hook();
  if (name == "fp16")
    return ronde::fp16_compress_hook();
  if (name == "bf16")
    return ronde::bf16_compress_hook();
  if (name == "powersgd") {
    return ronde::powersgd_hook(ronde::PowerSGDOptions()
                                    .rank(powersgd_rank)
                                    .start_iter(powersgd_start));
  }
  if (name == "scaled_fp16")
    return std::make_shared<examples::ScaledFp16Hook>();
  TORCH_CHECK(
      false,
      "--comm-hook must be allreduce, fp16, bf16, powersgd or scaled_fp16, "
      "got '",
      name,
      "'");
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_example("fashion_mnist", [&] {
    examples::Flags flags(
        argc,
        argv,
        "Trains a CNN on Fashion-MNIST, data-parallel over the ranks of a "
        "ronde job.");
    const auto data_dir = flags.str(
        "data",
        examples::kFashionMnistDir,
        "directory with the four IDX files (plain or .gz)");
    const auto epochs =
        flags.integer("epochs", 3, "passes over the training set");
    auto batch = flags.integer("batch-size", 64, "samples per rank per step");
    const auto global_batch = flags.integer(
        "global-batch",
        0,
        "samples per step over all ranks (overrides --batch-size)");
    const auto lr = flags.real(
        "lr",
        0.05,
        "SGD learning rate for a batch of 64 samples, scaled linearly with the "
        "global batch");
    const auto momentum = flags.real("momentum", 0.9, "SGD momentum");
    const bool batch_norm = flags.boolean(
        "batch-norm",
        "batch norm after each convolution, on each rank's own batch");
    const bool sync_bn = flags.boolean(
        "sync-bn",
        "batch norm after each convolution on the global batch "
        "(ronde::nn::SyncBatchNorm)");
    const auto warmup_epochs =
        flags.real("warmup-epochs", 0.5, "epochs of LR warmup");
    const auto seed = flags.integer(
        "seed", 0, "seed of the initial weights and of the data order");
    const auto log_every = flags.integer(
        "log-every",
        100,
        "steps between progress lines (0: epoch summaries only)");
    const auto metrics_out = flags.str(
        "metrics-out", "", "JSON lines file of the progress and epoch figures");
    const auto train_limit = flags.integer(
        "train-limit", 0, "train on the first N samples only (0: all 60000)");
    const auto test_limit = flags.integer(
        "test-limit",
        0,
        "evaluate on the first N test samples only (0: all 10000)");
    const auto threads = flags.integer(
        "threads",
        0,
        "intra-op threads per rank (0: the cores divided by the local ranks)");
    const auto checkpoint_dir = flags.str(
        "checkpoint-dir",
        "",
        "checkpoint there every --checkpoint-every steps, and resume from the "
        "newest checkpoint at start-up");
    const auto checkpoint_every =
        flags.integer("checkpoint-every", 200, "steps between checkpoints");
    const auto comm_hook = flags.str(
        "comm-hook",
        "allreduce",
        "what each gradient bucket's reduction is: allreduce, fp16, bf16, "
        "powersgd, or scaled_fp16 (a hook of this example's own, "
        "common/scaled_fp16_hook.h)");
    const auto powersgd_rank =
        flags.integer("powersgd-rank", 1, "PowerSGD's approximation rank");
    const auto powersgd_start = flags.integer(
        "powersgd-start-iter",
        100,
        "steps of plain all-reduce before PowerSGD compresses");
    if (!flags.finish()) {
      return 0;
    }

    ronde::init();
    examples::set_threads(threads);
    TORCH_CHECK(epochs >= 1, "--epochs must be at least 1, got ", epochs);
    auto batches =
        global_batch > 0
            ? ronde::GlobalBatch::global(global_batch)  // refuses a remainder
            : ronde::GlobalBatch::per_replica(batch);
    batch = batches.per_replica_batch();

    const auto dataset = examples::load_fashion_mnist(data_dir);
    const auto train = examples::to_tensors(dataset.train, train_limit);
    const auto test = examples::to_tensors(dataset.test, test_limit);

    // Same initial weights everywhere: seed, then rank 0's values win.
    torch::manual_seed(seed);
    examples::FashionNet model(batch_norm || sync_bn, sync_bn);
    ronde::broadcast_parameters(model->named_parameters(), /*root_rank=*/0);

    // Built with one replica's LR; LrScaling::Linear multiplies it by the
    // replicas, giving lr x global batch / 64.
    const double replica_lr =
        lr * static_cast<double>(batch) / examples::kReferenceBatch;
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(),
        torch::optim::SGDOptions(replica_lr).momentum(momentum));
    ronde::DistributedOptimizer optimizer(
        sgd,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions()
            .lr_scaling(ronde::LrScaling::Linear)
            .comm_hook(make_hook(comm_hook, powersgd_rank, powersgd_start)));

    ronde::DistributedSampler sampler(
        train.size(), ronde::DistributedSamplerOptions().seed(seed));
    const int64_t steps_per_epoch =
        (static_cast<int64_t>(sampler.num_samples()) + batch - 1) / batch;
    const int64_t total_steps = epochs * steps_per_epoch;
    const int64_t warmup_steps = std::min<int64_t>(
        total_steps - 1, std::llround(warmup_epochs * steps_per_epoch));
    // Warm up from the LR of a 64-sample batch to the scaled LR (the same
    // ramp for any number of ranks at one global batch), then cosine decay.
    ronde::WarmupScheduler schedule(
        optimizer,
        ronde::WarmupOptions()
            .warmup_steps(warmup_steps)
            .multiplier(std::max(
                1.0,
                static_cast<double>(batches.global_batch()) /
                    examples::kReferenceBatch))
            .then(ronde::Decay::cosine(total_steps - warmup_steps)));

    ronde::TrainingMonitor monitor(ronde::MonitorOptions()
                                       .epochs(epochs)
                                       .steps_per_epoch(steps_per_epoch)
                                       .log_every(log_every)
                                       .metrics_out(metrics_out));
    if (monitor.printing()) {
      std::cout << "fashion_mnist: " << ronde::size() << " ranks, "
                << train.size() << " training and " << test.size()
                << " test samples, global batch " << batches.global_batch()
                << " (" << batch << " per rank), " << steps_per_epoch
                << " steps per epoch, LR " << replica_lr << " x "
                << optimizer.lr_scale_factor() << " after " << warmup_steps
                << " warmup steps" << std::endl;
    }

    // With --checkpoint-dir: everything a step depends on is saved, and a
    // restarted job goes on from the newest checkpoint, mid-epoch included.
    int64_t step = 0, epoch = 0;
    std::optional<ronde::Checkpointer> checkpoints;
    bool resumed = false;
    if (!checkpoint_dir.empty()) {
      checkpoints.emplace(checkpoint_dir, checkpoint_every, /*keep_last=*/2);
      checkpoints->add("model", *model)
          .add("optimizer", optimizer)
          .add("schedule", schedule)
          .add("sampler", sampler)
          .add("step", step)
          .add("epoch", epoch);
      resumed = checkpoints->restore().has_value();
      if (resumed && monitor.printing()) {
        std::cout << "fashion_mnist: resumed from " << checkpoint_dir
                  << " at step " << step << std::endl;
      }
    }

    examples::Evaluation eval;
    for (; epoch < epochs; ++epoch) {
      if (!resumed) {
        sampler.set_epoch(epoch);  // a new shuffle, the same on every rank
      }
      monitor.start_epoch(epoch, step - epoch * steps_per_epoch);
      resumed = false;
      while (auto indices = sampler.next(batch)) {
        auto idx = torch::tensor(
            std::vector<int64_t>(indices->begin(), indices->end()));
        optimizer.zero_grad();
        auto loss = torch::cross_entropy_loss(
            model->forward(train.images.index_select(0, idx)),
            train.labels.index_select(0, idx));
        loss.backward();   // buckets are all-reduced while backward runs
        optimizer.step();  // waits for the rest, then steps SGD
        schedule.step();
        monitor.step(
            loss.item<double>(),
            idx.size(0),
            optimizer.last_step_profile().wait_seconds);
        if (checkpoints) {
          checkpoints->maybe_save(++step);
        } else {
          ++step;
        }
      }
      eval = examples::evaluate(model, test);
      monitor.end_epoch({{"val_loss", eval.loss}, {"val_acc", eval.accuracy}});
    }
    if (monitor.printing()) {
      std::cout << "fashion_mnist: test accuracy " << eval.accuracy
                << "% after " << epochs << (epochs == 1 ? " epoch" : " epochs")
                << std::endl;
      const auto& hook = optimizer.comm_hook();
      std::cout << "fashion_mnist: comm hook " << hook->name() << " sent "
                << hook->bytes_sent() / std::max<int64_t>(step, 1)
                << " bytes per step" << std::endl;
    }
    ronde::shutdown();
    return 0;
  });
}
