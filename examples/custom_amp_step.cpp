// A hand-written mixed-precision training step with ronde:
//
//   ronderun -np 2 -- custom_amp_step
//
// The forward pass runs under autocast (bfloat16 on CPU, float16 on CUDA),
// the loss is scaled before backward, the averaged gradients are unscaled
// after the all-reduce, clipped, and the step is skipped on every rank
// together when any gradient overflowed; the scale backs off after an
// overflow and grows after a run of clean steps.
#include "common/classifier.h"
#include "common/flags.h"

#include <ronde/ronde.h>
#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <limits>

int main(int argc, char** argv) {
  return examples::run_example("custom_amp_step", [&] {
    examples::Flags flags(
        argc,
        argv,
        "Fashion-MNIST with autocast, loss scaling and gradient clipping.");
    const auto data_dir = flags.str(
        "data",
        examples::kFashionMnistDir,
        "directory with the four IDX files");
    const auto steps = flags.integer("steps", 200, "optimizer steps");
    const auto batch =
        flags.integer("batch-size", 64, "samples per rank per step");
    const auto lr =
        flags.real("lr", 0.05, "SGD learning rate for a batch of 64 samples");
    const auto max_norm = flags.real(
        "clip",
        1.0,
        "clip the gradients' global norm to this (0: no clipping)");
    const auto growth_interval = flags.integer(
        "growth-interval", 100, "clean steps before the loss scale grows");
    const auto overflow_at = flags.integer(
        "inject-overflow",
        -1,
        "make rank 1's loss infinite at this step, to see the step skipped on "
        "every rank");
    const auto log_every =
        flags.integer("log-every", 100, "steps between progress lines");
    const auto metrics_out =
        flags.str("metrics-out", "", "JSON lines file of the progress figures");
    const auto threads = flags.integer(
        "threads",
        0,
        "intra-op threads per rank (0: the cores divided by the local ranks)");
    if (!flags.finish()) {
      return 0;
    }

    ronde::init();
    examples::set_threads(threads);
    const auto device = ronde::device();
    // bfloat16 keeps float32's range: no overflow to guard against, but the
    // same code serves float16 on CUDA, where the scaler matters.
    const auto low_precision =
        device.is_cuda() ? torch::kHalf : torch::kBFloat16;

    const auto dataset = examples::load_fashion_mnist(data_dir);
    const auto train = examples::to_tensors(dataset.train);
    const auto test = examples::to_tensors(dataset.test);

    torch::manual_seed(0);
    examples::FashionNet model;
    model->to(device);
    ronde::broadcast_parameters(model->named_parameters(), 0);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(),
        torch::optim::SGDOptions(lr * batch / examples::kReferenceBatch)
            .momentum(0.9));
    ronde::DistributedOptimizer optimizer(
        sgd,
        model->named_parameters(),
        ronde::DistributedOptimizerOptions().lr_scaling(
            ronde::LrScaling::Linear));
    ronde::GradScaler scaler(
        ronde::GradScalerOptions().growth_interval(growth_interval));

    ronde::DistributedSampler sampler(train.size());
    ronde::TrainingMonitor monitor(ronde::MonitorOptions()
                                       .steps_per_epoch(steps)
                                       .log_every(log_every)
                                       .metrics_out(metrics_out));
    monitor.start_epoch();
    int64_t skipped = 0;
    for (int64_t step = 0, epoch = 0; step < steps; ++step) {
      auto indices = sampler.next(batch);
      if (!indices) {  // next epoch
        sampler.set_epoch(++epoch);
        indices = sampler.next(batch);
      }
      auto idx =
          torch::tensor(std::vector<int64_t>(indices->begin(), indices->end()));
      auto images = train.images.index_select(0, idx).to(device);
      auto labels = train.labels.index_select(0, idx).to(device);

      optimizer.zero_grad();
      torch::Tensor logits;
      {
        ronde::AutocastGuard autocast(device.type(), low_precision);
        logits = model->forward(images);
      }
      // The loss in float32, outside autocast.
      auto loss = torch::cross_entropy_loss(logits.to(torch::kFloat), labels);
      if (step == overflow_at &&
          ronde::rank() == std::min(1, ronde::size() - 1)) {
        loss = loss * std::numeric_limits<float>::infinity();
      }
      scaler.scale(loss).backward();  // buckets all-reduce the scaled gradients
      scaler.unscale(optimizer);      // waits for them, unscales the averages
      if (max_norm > 0) {
        torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm);
      }
      if (!scaler.step(optimizer)) {  // the same verdict on every rank
        ++skipped;
      }
      scaler.update();
      monitor.step(
          loss.item<double>(),
          idx.size(0),
          optimizer.last_step_profile().wait_seconds);
    }
    auto eval = examples::evaluate(model, test);
    monitor.end_epoch(
        {{"val_loss", eval.loss},
         {"val_acc", eval.accuracy},
         {"skipped_steps", static_cast<double>(skipped)},
         {"loss_scale", scaler.get_scale()}});

    // Every rank skipped the same steps, so the replicas are still identical.
    double checksum = 0;
    for (const auto& p : model->parameters()) {
      checksum += p.detach().to(torch::kDouble).sum().item<double>();
    }
    if (monitor.printing()) {
      std::cout << "custom_amp_step: rank " << ronde::rank() << ": " << skipped
                << " of " << steps << " steps skipped on overflow, loss scale "
                << scaler.get_scale() << ", test accuracy " << eval.accuracy
                << "%, parameter checksum " << std::setprecision(17) << checksum
                << std::endl;
    }
    ronde::shutdown();
    return 0;
  });
}
