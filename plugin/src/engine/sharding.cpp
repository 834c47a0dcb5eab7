#include "engine/sharding.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ronde::detail {

std::pair<int64_t, int64_t> owned_range(int64_t numel, int rank, int size) {
  TORCH_INTERNAL_ASSERT(numel % kShardAlign == 0 && size > 0);
  const int64_t rows = numel / kShardAlign;
  const int64_t base = rows / size, extra = rows % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  const int64_t end = begin + base + (rank < extra ? 1 : 0);
  return {begin * kShardAlign, end * kShardAlign};
}

std::vector<ShardPiece> shard_pieces(
    const BucketLayout& layout, int rank, int size, bool aligned) {
  std::vector<ShardPiece> pieces;
  for (size_t bi = 0; bi < layout.buckets.size(); ++bi) {
    const LayoutBucket& b = layout.buckets[bi];
    // The aligned offsets of this bucket's segments.
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    for (size_t s : b.slots) {
      const int64_t offset =
          aligned ? layout.slots[s].offset : align_up(numel, kShardAlign);
      offsets.push_back(offset);
      numel = offset + layout.slots[s].param.numel();
    }
    numel = align_up(numel, kShardAlign);
    TORCH_INTERNAL_ASSERT(!aligned || numel == b.numel);
    const auto [lo, hi] = owned_range(numel, rank, size);
    for (size_t pos = 0; pos < b.slots.size(); ++pos) {
      const int64_t first = offsets[pos];
      const int64_t last = first + layout.slots[b.slots[pos]].param.numel();
      const int64_t begin = std::max(first, lo), end = std::min(last, hi);
      if (begin >= end)
        continue;
      ShardPiece p;
      p.bucket = bi;
      p.slot = b.slots[pos];
      p.param = layout.slots[b.slots[pos]].index;
      p.param_offset = begin - first;
      p.bucket_offset = begin;
      p.numel = end - begin;
      pieces.push_back(p);
    }
  }
  return pieces;
}

}  // namespace ronde::detail
