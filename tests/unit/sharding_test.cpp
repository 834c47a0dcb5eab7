// ZeRO ownership (engine/sharding.h): balanced aligned ranges that tile a
// bucket in rank order, the pieces of parameters inside each, and the
// aligned layout they assume.
#include "engine/sharding.h"
#include "engine/bucket_layout.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using namespace ronde::detail;

TEST(Sharding, RangesTileTheBucketBalancedAndAligned) {
  for (int n : {1, 2, 3, 4, 7}) {
    for (int64_t rows : {0, 1, 5, 16, 100}) {
      const int64_t numel = rows * kShardAlign;
      int64_t next = 0;
      for (int r = 0; r < n; ++r) {
        auto [lo, hi] = owned_range(numel, r, n);
        EXPECT_EQ(lo, next);
        EXPECT_EQ(lo % kShardAlign, 0);
        const int64_t len = (hi - lo) / kShardAlign;
        EXPECT_TRUE(len == rows / n || len == rows / n + 1);
        // As reducescatter splits dim 0: the first ranks one row longer.
        EXPECT_EQ(len, rows / n + (r < rows % n ? 1 : 0));
        next = hi;
      }
      EXPECT_EQ(next, numel);
    }
  }
}

TEST(Sharding, PiecesCoverEveryParameterOnceAcrossRanks) {
  std::vector<at::Tensor> params = {
      at::zeros({5, 7}), at::zeros({3}), at::zeros({40}), at::zeros({2, 2})};
  std::vector<std::string> names = {"a", "b", "c", "d"};
  BucketLayout layout = make_layout(
      names,
      params,
      reverse_order(params.size()),
      1 << 20,
      1 << 20,
      kShardAlign);
  ASSERT_EQ(layout.buckets.size(), 1u);
  // Aligned segments, padded end.
  for (const auto& s : layout.slots)
    EXPECT_EQ(s.offset % kShardAlign, 0);
  EXPECT_EQ(layout.buckets[0].numel % kShardAlign, 0);
  for (int n : {1, 2, 3, 4}) {
    std::vector<int64_t> covered(params.size(), 0);
    for (int r = 0; r < n; ++r) {
      int64_t last_end = -1;
      for (const ShardPiece& p : shard_pieces(layout, r, n)) {
        EXPECT_GT(p.numel, 0);
        EXPECT_GE(p.bucket_offset, last_end);  // in bucket order
        last_end = p.bucket_offset + p.numel;
        covered[p.param] += p.numel;
        EXPECT_LE(p.param_offset + p.numel, params[p.param].numel());
        EXPECT_EQ(
            p.bucket_offset - p.param_offset,
            layout.slots[layout.slot_of[p.param]].offset);
      }
    }
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_EQ(covered[i], params[i].numel()) << "n=" << n << " param " << i;
  }
}

TEST(Sharding, UnalignedLayoutGetsTheAlignedPieces) {
  std::vector<at::Tensor> params = {
      at::zeros({5, 7}), at::zeros({3}), at::zeros({40})};
  std::vector<std::string> names = {"a", "b", "c"};
  auto order = reverse_order(params.size());
  BucketLayout aligned =
      make_layout(names, params, order, 1 << 20, 1 << 20, kShardAlign);
  BucketLayout plain = make_layout(names, params, order, 1 << 20, 1 << 20);
  for (int r = 0; r < 3; ++r) {
    auto a = shard_pieces(aligned, r, 3);
    auto b = shard_pieces(plain, r, 3, /*aligned=*/false);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].param, b[k].param);
      EXPECT_EQ(a[k].param_offset, b[k].param_offset);
      EXPECT_EQ(a[k].numel, b[k].numel);
    }
  }
}
