// ZeRO sharding of a bucket layout: the contiguous range of each bucket's
// flat buffer that each rank owns, and the pieces of parameters inside it.
// Pure functions of the layout, the rank and the set's size, so every rank
// knows every rank's ownership without asking (docs/sharding.md).
#pragma once

#include "engine/bucket_layout.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace ronde::detail {

// Ownership is in rows of this many elements (64 bytes of float32): a range
// starts where vector kernels start, and a bucket reduce-scatters as a
// [rows, kShardAlign] tensor, whose rows the collective splits evenly.
constexpr int64_t kShardAlign = 16;

// [begin, end) of a flat buffer of `numel` elements (a multiple of
// kShardAlign) that rank `rank` of `size` owns: the rows split as
// reducescatter splits dim 0, the first numel / kShardAlign % size ranks
// one row longer.
std::pair<int64_t, int64_t> owned_range(int64_t numel, int rank, int size);

// One parameter's part of a rank's range.
struct ShardPiece {
  size_t bucket = 0;
  size_t slot = 0;            // into BucketLayout::slots
  size_t param = 0;           // the parameter's index
  int64_t param_offset = 0;   // first element, in the flattened parameter
  int64_t bucket_offset = 0;  // first element, in the bucket's flat buffer
  int64_t numel = 0;
};

// The pieces rank `rank` owns, bucket by bucket and in bucket order within
// each. Offsets are those of `layout` (a sharded layout, aligned to
// kShardAlign); `aligned` false computes them as an aligned layout of the
// same buckets would place them, for figures (the clipping norm) that must
// come out alike whether the job shards or not.
std::vector<ShardPiece> shard_pieces(
    const BucketLayout& layout, int rank, int size, bool aligned = true);

}  // namespace ronde::detail
