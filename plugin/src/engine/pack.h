// Bucket packing and unpacking: gradients copied into their segments of a
// bucket's flat buffer and back, in few launches. Header-only so that
// benchmarks/pack_bench measures this very code.
//
// On CUDA, a bucket whose every segment is copied (the usual case when
// gradients are not views of the bucket) moves in one LibTorch
// concatenation (pack) or split-and-copy (unpack): each is one kernel whose
// grid grows with the largest tensor, with 16-byte accesses where the
// addresses allow. A bucket only partly copied (some gradients already are
// their segments, or absent), and any bucket on the CPU, takes the
// multi-tensor copy: on CUDA one kernel per few hundred chunks of 64 Ki
// elements. Measured on an H200 against one flat copy of the same bytes,
// that multi-tensor copy reaches about 60% for a 25 MB bucket of 5 tensors
// (a grid of fewer blocks than the device has multiprocessors) and 80% for
// 256 MB; one copy_ per tensor was no better. benchmarks/pack_bench times
// both ways side by side.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {

// dst[i].copy_(src[i]) for every i (same shapes), batched.
inline void batched_copy(
    const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  at::_foreach_copy_(dst, src);
}

// Whether `segments` are `flat`'s consecutive pieces, in order and covering
// all of it, and each of `tensors` (one per segment, of its size) is dense
// with flat's dtype and device: then one concatenation or split moves them
// all, exactly as the per-segment copies would.
inline bool fills_whole(
    const at::Tensor& flat,
    const std::vector<at::Tensor>& segments,
    const std::vector<at::Tensor>& tensors) {
  if (segments.empty() || segments.size() != tensors.size() ||
      flat.dim() != 1 || !flat.is_contiguous())
    return false;
  const auto* next = static_cast<const char*>(flat.data_ptr());
  const int64_t item = flat.element_size();
  int64_t numel = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const at::Tensor& s = segments[i];
    const at::Tensor& t = tensors[i];
    // (An empty tensor has no address: it only has to fit.)
    if ((s.numel() > 0 && static_cast<const char*>(s.data_ptr()) != next) ||
        !s.is_contiguous() || s.scalar_type() != flat.scalar_type() ||
        !t.is_contiguous() || t.scalar_type() != flat.scalar_type() ||
        t.device() != flat.device() || t.numel() != s.numel())
      return false;
    next += s.numel() * item;
    numel += s.numel();
  }
  return numel == flat.numel();
}

namespace batched_copy_detail {
inline std::vector<at::Tensor> flattened(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts)
    out.push_back(t.view({-1}));
  return out;
}
}  // namespace batched_copy_detail

// Packs grads[i] into segments[i] for every i by one concatenation into
// `flat` when fills_whole() holds; returns false (and copies nothing)
// otherwise.
inline bool pack_whole(
    const at::Tensor& flat,
    const std::vector<at::Tensor>& segments,
    const std::vector<at::Tensor>& grads) {
  if (!fills_whole(flat, segments, grads))
    return false;
  at::Tensor out = flat;  // cat_out's out is a non-const reference
  at::cat_out(out, batched_copy_detail::flattened(grads), 0);
  return true;
}

// Unpacks segments[i] into grads[i] for every i by one split of `flat` when
// fills_whole() holds; returns false (and copies nothing) otherwise.
inline bool unpack_whole(
    const at::Tensor& flat,
    const std::vector<at::Tensor>& segments,
    const std::vector<at::Tensor>& grads) {
  if (!fills_whole(flat, segments, grads))
    return false;
  std::vector<int64_t> sizes;
  sizes.reserve(segments.size());
  for (const auto& s : segments)
    sizes.push_back(s.numel());
  at::split_with_sizes_copy_out(
      batched_copy_detail::flattened(grads), flat, sizes, 0);
  return true;
}

// Whether the engine moves a whole bucket by one concatenation or split
// rather than the multi-tensor copy: on CUDA, where the multi-tensor copy
// spreads a bucket of tens of MB over too few blocks; not on the CPU,
// where both are loops of memcpy-like copies: the same speed at 25 and
// 64 MB, and the multi-tensor copy 10-30% faster for buckets that fit in
// cache (4 and 8 MB; 2 cores). `setting` (RONDE_BUCKET_COPY: true for
// whole, false for multi) overrides that on every device.
inline bool prefers_whole(const at::Tensor& flat, std::optional<bool> setting) {
  return setting ? *setting : flat.is_cuda();
}

// What the engine does for one bucket: the whole-bucket kernel when it
// applies and is preferred, the multi-tensor copy otherwise.
inline void pack_segments(
    const at::Tensor& flat,
    const std::vector<at::Tensor>& segments,
    const std::vector<at::Tensor>& grads,
    std::optional<bool> setting) {
  if (!prefers_whole(flat, setting) || !pack_whole(flat, segments, grads))
    batched_copy(segments, grads);
}

inline void unpack_segments(
    const at::Tensor& flat,
    const std::vector<at::Tensor>& segments,
    const std::vector<at::Tensor>& grads,
    std::optional<bool> setting) {
  if (!prefers_whole(flat, setting) || !unpack_whole(flat, segments, grads))
    batched_copy(grads, segments);
}

}  // namespace ronde::detail
