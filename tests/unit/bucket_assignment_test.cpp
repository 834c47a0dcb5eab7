// Bucket assignment: caps, the small first bucket, keys kept apart, order;
// and bucket packing.
#include "engine/bucket_assignment.h"
#include "engine/pack.h"
#include "fake_env.h"
#include "runtime/settings.h"

#include <gtest/gtest.h>

#include <map>

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

// Sharded layouts: a tensor of at least `alone` bytes is a bucket's only
// member, the bucket open before it closed early; smaller ones as before.
TEST(BucketAssignment, AloneFromGivesLargeTensorsABucketEach) {
  std::vector<size_t> bytes = {10, 1000, 10, 10, 300, 400, 10};
  std::vector<std::string> keys(7, "f32");
  Buckets b = assign_buckets(bytes, keys, 100, 100, 300);
  EXPECT_EQ(b, (Buckets{{0}, {1}, {2, 3}, {4}, {5}, {6}}));
  // Per key: a large f16 tensor does not close the open f32 bucket.
  std::vector<std::string> mixed = {"f32", "f16", "f32"};
  EXPECT_EQ(
      assign_buckets({10, 1000, 10}, mixed, 100, 100, 300),
      (Buckets{{0, 2}, {1}}));
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

// Bucket packing (engine/pack.h): the whole-bucket concatenation and
// split only when they do exactly what the per-segment copies do.
namespace {

struct Bucket {
  at::Tensor flat;
  std::vector<at::Tensor> segments;
};

Bucket bucket_for(const std::vector<at::Tensor>& grads) {
  int64_t n = 0;
  for (const auto& g : grads)
    n += g.numel();
  Bucket b{at::full({n}, -1.0f), {}};
  int64_t offset = 0;
  for (const auto& g : grads) {
    b.segments.push_back(b.flat.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
  return b;
}

at::Tensor flattened_cat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  for (const auto& t : ts)
    flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

}  // namespace

TEST(BucketPacking, WholeBucketMovesLikePerSegmentCopies) {
  using namespace ronde::detail;
  at::manual_seed(3);
  // A matrix, an empty tensor, a scalar and a vector of odd length.
  std::vector<at::Tensor> grads = {
      at::randn({3, 5}), at::randn({0, 4}), at::randn({}), at::randn({7})};
  Bucket b = bucket_for(grads);
  ASSERT_TRUE(fills_whole(b.flat, b.segments, grads));
  ASSERT_TRUE(pack_whole(b.flat, b.segments, grads));
  EXPECT_TRUE(at::equal(b.flat, flattened_cat(grads)));
  std::vector<at::Tensor> back;
  for (const auto& g : grads)
    back.push_back(at::zeros_like(g));
  ASSERT_TRUE(unpack_whole(b.flat, b.segments, back));
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(at::equal(back[i], grads[i])) << "tensor " << i;
  }
}

TEST(BucketPacking, AnythingButAWholeDenseBucketTakesTheMultiTensorCopy) {
  using namespace ronde::detail;
  std::vector<at::Tensor> grads = {at::randn({4, 3}), at::randn({5})};
  Bucket b = bucket_for(grads);
  const at::Tensor before = b.flat.clone();
  auto refused = [&](const std::vector<at::Tensor>& segments,
                     const std::vector<at::Tensor>& tensors) {
    EXPECT_FALSE(fills_whole(b.flat, segments, tensors));
    EXPECT_FALSE(pack_whole(b.flat, segments, tensors));
    EXPECT_TRUE(at::equal(b.flat, before)) << "a refused pack wrote";
  };
  // Out of order, or not covering the bucket.
  refused({b.segments[1], b.segments[0]}, {grads[1], grads[0]});
  refused({b.segments[0]}, {grads[0]});
  refused({b.segments[1]}, {grads[1]});
  // A transposed (non-dense) gradient, another dtype, a size mismatch.
  refused(b.segments, {grads[0].t().contiguous().t(), grads[1]});
  refused(b.segments, {grads[0].to(at::kDouble), grads[1]});
  refused(b.segments, {grads[0], at::randn({6})});
  // The engine's way for such a bucket still copies every segment.
  const at::Tensor odd = grads[0].t().contiguous().t();
  pack_segments(b.flat, b.segments, {odd, grads[1]}, std::nullopt);
  EXPECT_TRUE(at::equal(b.flat, flattened_cat({odd, grads[1]})));
  // Unless RONDE_BUCKET_COPY says otherwise, the engine takes the
  // multi-tensor copy on the CPU (as fast or faster there) and the
  // whole-bucket kernels on CUDA.
  EXPECT_FALSE(prefers_whole(b.flat, std::nullopt));
}

TEST(BucketPacking, BucketCopySettingIsWholeMultiOrUnset) {
  // RONDE_BUCKET_COPY as the settings read it: unset (by device), whole,
  // multi, or an error naming the variable.
  auto parse_bucket_copy = [](const char* v) {
    std::map<std::string, std::string> vars;
    if (v != nullptr)
      vars["RONDE_BUCKET_COPY"] = v;
    auto s = ronde::detail::read_settings(ronde::testing::fake_env(vars));
    return s.bucket_copy_whole ? (*s.bucket_copy_whole ? 1 : 0) : -1;
  };
  EXPECT_EQ(parse_bucket_copy(nullptr), -1);
  EXPECT_EQ(parse_bucket_copy(""), -1);
  EXPECT_EQ(parse_bucket_copy("whole"), 1);
  EXPECT_EQ(parse_bucket_copy("multi"), 0);
  try {
    parse_bucket_copy("cat");
    ADD_FAILURE() << "RONDE_BUCKET_COPY=cat accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find("RONDE_BUCKET_COPY='cat'"),
        std::string::npos)
        << e.what_without_backtrace();
  }
}
