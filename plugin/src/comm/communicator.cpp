// The Communicator's default collectives, for backends without their own,
// and its default frame exchange.
#include "comm/communicator.h"

#include <ATen/ATen.h>

#include <numeric>

namespace ronde::detail {

void Communicator::reduce_scatter(
    const at::Tensor& in,
    const at::Tensor& out,
    const std::vector<int64_t>& counts,
    BackendOp op) {
  at::Tensor work = in.clone();
  allreduce(work, op);
  const int64_t start =
      std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
  out.view(-1).copy_(work.view(-1).narrow(0, start, counts[rank()]));
}

bool Communicator::exchange_frames(
    const uint8_t* mine,
    size_t frame_bytes,
    uint8_t* frames,
    const FusedAllreduce* /*fused*/) {
  const auto bytes = static_cast<int64_t>(frame_bytes);
  allgather(
      at::from_blob(const_cast<uint8_t*>(mine), {bytes}, at::kByte),
      at::from_blob(frames, {bytes * size()}, at::kByte),
      std::vector<size_t>(size(), frame_bytes));
  return false;
}

}  // namespace ronde::detail
