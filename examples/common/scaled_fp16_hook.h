// A communication hook of one's own, written against ronde's public API
// only (ronde/comm_hook.h): the bucket travels as float16, like
// fp16_compress_hook(), but scaled first so that the largest gradient of
// any rank sits near the top of float16's range. Gradients far below 1
// (a small loss, a late stage of training) then keep their digits instead
// of flushing to zero. One extra all-reduce of one number per bucket.
//
//   ronde::DistributedOptimizerOptions().comm_hook(
//       std::make_shared<examples::ScaledFp16Hook>())
#pragma once

#include <ronde/comm_hook.h>

#include <torch/torch.h>

#include <string>

namespace examples {

class ScaledFp16Hook : public ronde::CommHook {
 public:
  std::string name() const override {
    return "scaled_fp16";
  }

  // Runs on the communication thread for CPU buckets: each collective has
  // finished when its call returns, and wait() costs nothing.
  void reduce(ronde::CommBucket& bucket) override {
    count_bucket();
    const torch::Tensor& buffer = bucket.buffer;
    // The buffer holds the gradients first, then one used flag each: only
    // the gradients are scaled.
    int64_t n = 0;
    for (const auto& g : bucket.gradients)
      n += g.numel();
    torch::Tensor grads = buffer.narrow(0, 0, n);
    torch::Tensor flags = buffer.narrow(0, n, buffer.numel() - n);

    // The largest magnitude on any rank, in one small all-reduce.
    torch::Tensor amax = grads.abs().max().to(torch::kFloat).reshape({1});
    ronde::allreduce_async_(
        amax,
        ronde::AllreduceOptions()
            .op(ronde::ReduceOp::Max)
            .name(bucket.options.name() + ".amax")
            .process_set(bucket.process_set)
            .verify(bucket.options.verify()))
        .wait();
    // The sum of every rank's scaled values stays below float16's largest
    // (65504), with room for the pre- and postscale factors.
    const double top = amax.item<double>();
    const double ranks = bucket.process_set.size();
    const double scale = top > 0 ? 16384.0 / (top * ranks) : 1.0;

    torch::Tensor wire = torch::cat({grads * scale, flags}).to(torch::kHalf);
    count_bytes(wire.numel() * wire.element_size() + amax.element_size());
    ronde::allreduce_async_(wire, bucket.options).wait();
    grads.copy_(wire.narrow(0, 0, n).to(buffer.scalar_type()) / scale);
    flags.copy_(wire.narrow(0, n, flags.numel()));
  }
};

}  // namespace examples
