#include "engine/bucket_layout.h"

#include "engine/bucket_assignment.h"
#include "engine/cross_rank_check.h"

#include <ATen/ATen.h>

#include <limits>

namespace ronde::detail {
namespace {

std::vector<int64_t> dense_strides(at::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

std::string bucket_name(
    size_t index,
    const std::vector<size_t>& members,
    const BucketLayout& layout,
    const std::vector<std::string>& names) {
  std::string list;
  for (size_t pos = 0; pos < members.size() && pos < 3; ++pos)
    list += (pos ? ", " : "") + names[layout.slots[members[pos]].index];
  if (members.size() > 3)
    list += ", +" + std::to_string(members.size() - 3) + " more";
  return "ronde.bucket." + std::to_string(index) + " [" + list + "]";
}

}  // namespace

// An alias of the buffer's storage rather than an autograd view: LibTorch's
// zero_grad() calls detach_(), which views refuse.
at::Tensor segment_view(
    const at::Tensor& buffer, int64_t offset, at::IntArrayRef sizes) {
  return at::empty({0}, buffer.options())
      .set_(
          buffer.storage(),
          buffer.storage_offset() + offset,
          sizes,
          dense_strides(sizes));
}

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order;
  order.reserve(n);
  for (size_t i = n; i-- > 0;)
    order.push_back(i);
  return order;
}

BucketLayout make_layout(
    const std::vector<std::string>& names,
    const std::vector<at::Tensor>& params,
    const std::vector<size_t>& order,
    size_t first_cap,
    size_t cap,
    int64_t align,
    bool allocate,
    const BufferZeros& zeros) {
  BucketLayout layout;
  layout.slot_of.assign(params.size(), 0);
  std::vector<size_t> bytes;
  std::vector<std::string> keys;
  for (size_t i : order) {
    LayoutSlot slot;
    slot.param = params[i];
    slot.index = i;
    layout.slot_of[i] = layout.slots.size();
    layout.slots.push_back(std::move(slot));
    bytes.push_back(params[i].numel() * params[i].element_size());
    keys.push_back(dtype_device_key(params[i]));
  }
  // Sharded (aligned) layouts give a parameter of a bucket's size or more a
  // bucket of its own, so that the all-gather writes straight into it
  // (docs/sharding.md, "The all-gather").
  const size_t alone = align > 1 ? cap : std::numeric_limits<size_t>::max();
  for (auto& members : assign_buckets(bytes, keys, first_cap, cap, alone)) {
    LayoutBucket b;
    int64_t numel = 0;
    for (size_t pos = 0; pos < members.size(); ++pos) {
      LayoutSlot& s = layout.slots[members[pos]];
      s.bucket = layout.buckets.size();
      s.pos = pos;
      s.offset = align_up(numel, align);
      numel = s.offset + s.param.numel();
    }
    numel = align_up(numel, align);
    const at::Tensor& first = layout.slots[members.front()].param;
    if (allocate) {
      const int64_t total = numel + static_cast<int64_t>(members.size());
      const at::TensorOptions options = first.options().requires_grad(false);
      b.buffer = zeros ? zeros(total, options) : at::zeros({total}, options);
      b.flat = b.buffer.narrow(0, 0, numel);
      b.mask = b.buffer.narrow(0, numel, static_cast<int64_t>(members.size()));
    }
    b.numel = numel;
    for (size_t s : members) {
      LayoutSlot& slot = layout.slots[s];
      if (!allocate)
        continue;
      slot.view = segment_view(b.buffer, slot.offset, slot.param.sizes());
    }
    b.name = bucket_name(layout.buckets.size(), members, layout, names);
    b.slots = std::move(members);
    layout.buckets.push_back(std::move(b));
  }
  return layout;
}

}  // namespace ronde::detail
