// A large effective batch from small micro-batches:
//
//   ronderun -np 2 -- gradient_accumulation --micro-batch 32 --accumulate 4
//
// Each rank runs `--accumulate` forward/backward passes on micro-batches and
// the DistributedOptimizer all-reduces once per step
// (backward_passes_per_step), averaging over every micro-batch of every rank:
// the step sees the gradient of the whole effective batch (micro-batch x passes
// x ranks), and the LR is scaled to that batch (LrScaling::Linear counts the
// passes too).
#include "common/classifier.h"
#include "common/flags.h"

#include <ronde/ronde.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

int main(int argc, char** argv) {
  return examples::run_example("gradient_accumulation", [&] {
    examples::Flags flags(
        argc,
        argv,
        "Fashion-MNIST with gradients accumulated over micro-batches.");
    const auto data_dir = flags.str(
        "data",
        examples::kFashionMnistDir,
        "directory with the four IDX files");
    const auto epochs =
        flags.integer("epochs", 1, "passes over the training set");
    const auto micro_batch =
        flags.integer("micro-batch", 32, "samples per rank per backward pass");
    const auto passes =
        flags.integer("accumulate", 4, "backward passes per optimizer step");
    const auto lr = flags.real(
        "lr",
        0.05,
        "SGD learning rate for a batch of 64 samples, scaled linearly with the "
        "effective batch");
    const auto warmup_epochs =
        flags.real("warmup-epochs", 0.5, "epochs of LR warmup");
    const auto seed = flags.integer(
        "seed", 0, "seed of the initial weights and of the data order");
    const auto log_every = flags.integer(
        "log-every", 50, "optimizer steps between progress lines");
    const auto metrics_out = flags.str(
        "metrics-out", "", "JSON lines file of the progress and epoch figures");
    const auto train_limit = flags.integer(
        "train-limit", 0, "train on the first N samples only (0: all)");
    const auto test_limit = flags.integer(
        "test-limit", 0, "evaluate on the first N test samples only (0: all)");
    const auto threads = flags.integer(
        "threads",
        0,
        "intra-op threads per rank (0: the cores divided by the local ranks)");
    if (!flags.finish()) {
      return 0;
    }

    ronde::init();
    examples::set_threads(threads);
    const auto batches = ronde::GlobalBatch::per_replica(micro_batch, passes);

    const auto dataset = examples::load_fashion_mnist(data_dir);
    const auto train = examples::to_tensors(dataset.train, train_limit);
    const auto test = examples::to_tensors(dataset.test, test_limit);

    torch::manual_seed(seed);
    examples::FashionNet model;
    ronde::broadcast_parameters(model->named_parameters(), 0);

    // One micro-batch's LR; Linear scaling multiplies it by ranks x passes.
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(),
        torch::optim::SGDOptions(
            lr * static_cast<double>(micro_batch) / examples::kReferenceBatch)
            .momentum(0.9));
    ronde::DistributedOptimizer optimizer(
        sgd,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions()
            .backward_passes_per_step(passes)
            .lr_scaling(ronde::LrScaling::Linear));

    ronde::DistributedSampler sampler(
        train.size(), ronde::DistributedSamplerOptions().seed(seed));
    // Whole steps only: each rank's tail of fewer than micro-batch x passes
    // samples is left out of the epoch (the next epoch shuffles anew).
    const int64_t steps_per_epoch =
        static_cast<int64_t>(sampler.num_samples()) / (micro_batch * passes);
    TORCH_CHECK(
        steps_per_epoch > 0,
        "each rank has ",
        sampler.num_samples(),
        " samples, fewer than one step's micro-batch x passes = ",
        micro_batch * passes);
    const int64_t total_steps = epochs * steps_per_epoch;
    const int64_t warmup_steps = std::min<int64_t>(
        total_steps - 1, std::llround(warmup_epochs * steps_per_epoch));
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
      std::cout << "gradient_accumulation: " << ronde::size() << " ranks x "
                << passes << " passes x " << micro_batch
                << " samples = effective batch " << batches.global_batch()
                << ", LR x " << optimizer.lr_scale_factor() << std::endl;
    }

    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      monitor.start_epoch();
      for (int64_t step = 0; step < steps_per_epoch; ++step) {
        optimizer.zero_grad();
        double loss_sum = 0;
        for (int64_t pass = 0; pass < passes; ++pass) {
          auto indices = *sampler.next(micro_batch);
          auto idx = torch::tensor(
              std::vector<int64_t>(indices.begin(), indices.end()));
          auto loss = torch::cross_entropy_loss(
              model->forward(train.images.index_select(0, idx)),
              train.labels.index_select(0, idx));
          loss.backward();  // accumulates locally; the last pass all-reduces
          loss_sum += loss.item<double>();
        }
        optimizer
            .step();  // the mean gradient over passes x ranks micro-batches
        schedule.step();
        monitor.step(
            loss_sum / passes,
            micro_batch * passes,
            optimizer.last_step_profile().wait_seconds);
      }
      auto eval = examples::evaluate(model, test);
      monitor.end_epoch({{"val_loss", eval.loss}, {"val_acc", eval.accuracy}});
    }
    ronde::shutdown();
    return 0;
  });
}
