// Bytes of archives, and their gather over a process set (blobs.h).
#include "engine/blobs.h"

#include <ronde/collectives.h>

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <cstring>

namespace ronde::detail {

std::string bytes_of(torch::serialize::OutputArchive& a) {
  std::string out;
  a.save_to([&out](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  return out;
}

void load_bytes(torch::serialize::InputArchive& a, const std::string& bytes) {
  a.load_from(bytes.data(), bytes.size());
}

std::vector<std::string> exchange_blobs(
    const std::string& mine, const ProcessSet& set, int root) {
  const int n = set.size();
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lens = ronde::allgather(
      len,
      CollectiveOptions().name("ronde.shard.state_sizes").process_set(set));
  at::Tensor bytes = at::empty({static_cast<int64_t>(mine.size())}, at::kByte);
  if (!mine.empty())
    std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  const auto opts =
      CollectiveOptions().name("ronde.shard.state").process_set(set);
  at::Tensor all;
  if (root < 0) {
    all = ronde::allgather(bytes, opts);
  } else {
    std::vector<int64_t> splits(n, 0);
    splits[root] = static_cast<int64_t>(mine.size());
    all = ronde::alltoall(
        bytes,
        AlltoallOptions()
            .splits(splits)
            .name("ronde.shard.state")
            .process_set(set));
    if (set.rank() != root)
      return {};
  }
  std::vector<std::string> out;
  const auto* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < n; ++r) {
    const int64_t k = lens[r].item<int64_t>();
    out.emplace_back(p, p + k);
    p += k;
  }
  return out;
}

}  // namespace ronde::detail
