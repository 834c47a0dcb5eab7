// Bucket assignment: caps, the small first bucket, keys kept apart, order.
#include "optim/bucket_assignment.h"

#include <gtest/gtest.h>

using ronde::detail::assign_buckets;
using Buckets = std::vector<std::vector<size_t>>;

TEST(BucketAssignment, FirstBucketSmallThenCap) {
  // 10 tensors of 100 bytes; first cap 150, cap 300.
  std::vector<size_t> bytes(10, 100);
  std::vector<std::string> keys(10, "f32");
  Buckets b = assign_buckets(bytes, keys, 150, 300);
  EXPECT_EQ(b, (Buckets{{0, 1}, {2, 3, 4}, {5, 6, 7}, {8, 9}}));
}

TEST(BucketAssignment, LargeTensorGetsItsOwnBucket) {
  std::vector<size_t> bytes = {10, 1000, 10, 10};
  std::vector<std::string> keys(4, "f32");
  Buckets b = assign_buckets(bytes, keys, 100, 100);
  EXPECT_EQ(b, (Buckets{{0, 1}, {2, 3}}));
}

TEST(BucketAssignment, KeysNeverShareABucket) {
  std::vector<size_t> bytes = {10, 10, 10, 10};
  std::vector<std::string> keys = {"f32", "f16", "f32", "f16"};
  Buckets b = assign_buckets(bytes, keys, 1000, 1000);
  EXPECT_EQ(b, (Buckets{{0, 2}, {1, 3}}));
}

TEST(BucketAssignment, EveryIndexExactlyOnce) {
  std::vector<size_t> bytes;
  std::vector<std::string> keys;
  for (size_t i = 0; i < 97; ++i) {
    bytes.push_back((i * 37) % 500 + 1);
    keys.push_back(i % 3 ? "a" : "b");
  }
  Buckets b = assign_buckets(bytes, keys, 200, 900);
  std::vector<int> seen(97, 0);
  size_t prev_front = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (i > 0) {
      EXPECT_GT(b[i].front(), prev_front);
    }
    prev_front = b[i].front();
    for (size_t idx : b[i])
      ++seen[idx];
  }
  for (int s : seen)
    EXPECT_EQ(s, 1);
}

TEST(BucketAssignment, Empty) {
  EXPECT_TRUE(assign_buckets({}, {}, 1, 1).empty());
}
