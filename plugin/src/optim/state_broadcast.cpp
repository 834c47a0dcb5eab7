// Making every rank start from rank root's state: parameters and buffers
// (fused broadcasts), and any optimizer's state (its own serialisation).
#include <ronde/optimizer.h>

#include "engine/cross_rank_check.h"

#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <cstring>
#include <map>
#include <sstream>

namespace ronde {

void broadcast_parameters(
    const torch::OrderedDict<std::string, torch::Tensor>& named_tensors,
    int root_rank,
    const ProcessSet& process_set) {
  std::vector<std::string> lines;
  for (const auto& item : named_tensors) {
    lines.push_back(detail::describe_tensor(item.key(), item.value()));
  }
  detail::check_same_everywhere("broadcast_parameters", lines, process_set);
  torch::NoGradGuard no_grad;
  // One broadcast per dtype and device, in first-seen order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<at::Tensor>> groups;
  for (const auto& item : named_tensors) {
    const std::string key = detail::dtype_device_key(item.value());
    if (!groups.count(key))
      order.push_back(key);
    groups[key].push_back(item.value());
  }
  for (const auto& key : order) {
    auto& tensors = groups[key];
    std::vector<at::Tensor> flat;
    for (auto& t : tensors)
      flat.push_back(t.reshape({-1}));
    at::Tensor buffer = at::cat(flat);
    broadcast_(
        buffer,
        root_rank,
        CollectiveOptions()
            .name("ronde.broadcast_parameters." + key)
            .process_set(process_set));
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(buffer.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

void broadcast_optimizer_state(
    torch::optim::Optimizer& optimizer,
    int root_rank,
    const ProcessSet& process_set) {
  const bool root = process_set.rank() == root_rank;
  std::string bytes;
  if (root) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream os;
    archive.save_to(os);
    bytes = os.str();
  }
  at::Tensor len = ronde::broadcast(
      at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong),
      root_rank,
      CollectiveOptions()
          .name("ronde.optimizer_state.size")
          .process_set(process_set));
  at::Tensor data = at::empty({len.item<int64_t>()}, at::kByte);
  if (root) {
    std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  }
  broadcast_(
      data,
      root_rank,
      CollectiveOptions()
          .name("ronde.optimizer_state")
          .process_set(process_set));
  if (!root) {
    std::istringstream is(
        std::string(static_cast<const char*>(data.data_ptr()), data.numel()));
    torch::serialize::InputArchive archive;
    archive.load_from(is);
    optimizer.load(archive);
  }
}

}  // namespace ronde
