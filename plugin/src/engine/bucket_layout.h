// Where each gradient lives during its all-reduce: the parameters' order of
// readiness, their grouping into buckets (bucket_assignment.h), and each
// bucket's flat buffer with a view per parameter and the used-mask after
// them (sharded layouts: each segment starts at a multiple of `align`
// elements and the segments are padded to one). Pure data, built in one call,
// so that a later layout (rebuilt from the order gradients were seen in) can
// replace it between steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace ronde::detail {

struct LayoutSlot {
  at::Tensor param;
  size_t index = 0;    // the parameter's position in the user's list
  size_t bucket = 0;   // which bucket holds it
  size_t pos = 0;      // its position within that bucket
  int64_t offset = 0;  // its first element within the bucket's flat buffer
  at::Tensor view;     // its segment of the bucket buffer, shaped like it
};

struct LayoutBucket {
  std::vector<size_t> slots;  // into BucketLayout::slots, in bucket order
  // [every segment, then one used flag per parameter]: one all-reduce tells
  // both the sum and which ranks produced each gradient.
  at::Tensor buffer;
  at::Tensor flat;  // the segments: buffer less the mask
  at::Tensor mask;
  int64_t numel = 0;  // the segments' elements, padding included
  // The collective's name: the bucket's index and first parameters, so
  // that errors and stall reports say which tensors are involved.
  std::string name;
};

struct BucketLayout {
  std::vector<LayoutSlot> slots;      // in expected ready order
  std::vector<LayoutBucket> buckets;  // in launch order
  std::vector<size_t> slot_of;        // parameter index -> slot
};

// `params[order[k]]` is the k-th parameter expected to be ready; `names` are
// the user's names, by parameter index. Buckets hold parameters of one dtype
// and device, `first_cap` bytes for the first of each kind, `cap` after.
// Segments start at multiples of `align` elements, and the segments' end is
// padded to one. Without `allocate`, buffers and views stay undefined (a
// sharded layout whose buckets exist only while they are sent).
// Buffers come from `zeros` when given (the set's bucket_zeros(): shared
// memory that peers read in place), else from at::zeros.
using BufferZeros =
    std::function<at::Tensor(int64_t numel, const at::TensorOptions& options)>;
BucketLayout make_layout(
    const std::vector<std::string>& names,
    const std::vector<at::Tensor>& params,
    const std::vector<size_t>& order,
    size_t first_cap,
    size_t cap,
    int64_t align = 1,
    bool allocate = true,
    const BufferZeros& zeros = {});

// The segment of `buffer` at `offset` elements, shaped `sizes`, sharing its
// storage.
at::Tensor segment_view(
    const at::Tensor& buffer, int64_t offset, at::IntArrayRef sizes);

// `n` rounded up to a multiple of `align`.
inline int64_t align_up(int64_t n, int64_t align) {
  return (n + align - 1) / align * align;
}

// Bucket sizes are set in MiB (options, autotune) and laid out in bytes.
inline size_t mib_bytes(double mb) {
  return static_cast<size_t>(mb * (1 << 20));
}

// Reverse registration order: what backward produces first comes last in a
// model's parameter list.
std::vector<size_t> reverse_order(size_t n);

}  // namespace ronde::detail
