// The cross-rank descriptor check (comm/descriptor.h) on descriptors made in
// one process: what agrees passes, and each kind of disagreement throws the
// message every rank prints.
#include "comm/descriptor.h"

#include <ronde/collectives.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

using ronde::ReduceOp;
using ronde::detail::check_descriptors;
using ronde::detail::describe;
using ronde::detail::Descriptor;
using ronde::detail::OpKind;

Descriptor call(
    OpKind kind,
    const at::Tensor& t,
    const std::string& name = "",
    int op = -1,
    int root = -1,
    std::string error = "",
    const std::string& backend = "") {
  return describe(kind, t, name, op, root, backend, error);
}

Descriptor sum_call(const at::Tensor& t, const std::string& name = "x") {
  return call(OpKind::Allreduce, t, name, static_cast<int>(ReduceOp::Sum));
}

// The message check_descriptors() throws as rank `me`, or "" if none.
std::string verdict(const std::vector<Descriptor>& all, int me = 0) {
  try {
    check_descriptors(all, me);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(Descriptor, SameCallsAgree) {
  const at::Tensor t = at::zeros({4, 5});
  EXPECT_EQ(verdict({sum_call(t), sum_call(t), sum_call(t)}), "");
  EXPECT_EQ(
      verdict(
          {call(OpKind::Barrier, at::Tensor()),
           call(OpKind::Barrier, at::Tensor())}),
      "");
  // The same shape in another tensor, and another stride, is the same call.
  EXPECT_EQ(verdict({sum_call(t), sum_call(at::ones({5, 4}).t())}), "");
}

TEST(Descriptor, RaggedCollectivesMayDifferInDimZero) {
  auto gather = [](int64_t rows, int64_t cols) {
    return call(OpKind::Allgather, at::zeros({rows, cols}), "g");
  };
  EXPECT_EQ(verdict({gather(2, 3), gather(5, 3), gather(0, 3)}), "");
  const std::string msg = verdict({gather(2, 3), gather(2, 4)});
  EXPECT_EQ(
      msg,
      "ronde: ranks disagree on a collective (seen on rank 0): rank 0 called "
      "allgather Float[*, 3] 'g'; rank 1 called allgather Float[*, 4] 'g'");
  // Not so for an all-reduce.
  EXPECT_NE(
      verdict({sum_call(at::zeros({2, 3})), sum_call(at::zeros({3, 3}))}), "");
}

// A rank in ronde::join() describes no tensor; its descriptor agrees with
// another joined rank's, and a collective facing it names the join (the
// check replaces a joined rank's descriptor before it gets here: jobs.cpp).
TEST(Descriptor, JoinIsACallWithoutATensor) {
  const Descriptor j = call(OpKind::Join, at::Tensor(), "ronde.join");
  EXPECT_EQ(j.error[0], '\0');
  EXPECT_EQ(j.ndim, -1);
  EXPECT_EQ(verdict({j, j}), "");
  EXPECT_EQ(
      verdict({sum_call(at::zeros({2})), j}),
      "ronde: ranks disagree on a collective (seen on rank 0): rank 0 called "
      "allreduce(sum) Float[2] 'x'; rank 1 called join 'ronde.join'");
  EXPECT_TRUE(ronde::detail::ragged(OpKind::Allgather));
  EXPECT_TRUE(ronde::detail::ragged(OpKind::Alltoall));
  EXPECT_FALSE(ronde::detail::ragged(OpKind::Join));
}

TEST(Descriptor, ShapeMismatchNamesEveryGroupInRankOrder) {
  const at::Tensor a = at::zeros({4, 5});
  const at::Tensor b = at::zeros({4, 6});
  const std::string expected =
      "ronde: ranks disagree on a collective (seen on rank 2): ranks 0, 2 "
      "called allreduce(sum) Float[4, 5] 'x'; rank 1 called allreduce(sum) "
      "Float[4, 6] 'x'";
  EXPECT_EQ(verdict({sum_call(a), sum_call(b), sum_call(a)}, 2), expected);
}

TEST(Descriptor, EveryFieldOfTheCallCounts) {
  const at::Tensor f = at::zeros({3});
  auto op = [&](ReduceOp o) {
    return call(OpKind::Allreduce, f, "", static_cast<int>(o));
  };
  EXPECT_NE(
      verdict({op(ReduceOp::Sum), op(ReduceOp::Max)})
          .find("rank 0 called allreduce(sum) Float[3]; rank 1 called "
                "allreduce(max) Float[3]"),
      std::string::npos);
  EXPECT_NE(
      verdict({sum_call(f), sum_call(at::zeros({3}, at::kDouble))})
          .find("Double[3]"),
      std::string::npos);
  auto bcast = [&](int root) {
    return call(OpKind::Broadcast, f, "", -1, root);
  };
  EXPECT_NE(verdict({bcast(0), bcast(1)}).find("(root 1)"), std::string::npos);
  EXPECT_NE(
      verdict({sum_call(f, "a"), sum_call(f, "b")}).find("'b'"),
      std::string::npos);
  EXPECT_NE(
      verdict({call(OpKind::Allgather, f), call(OpKind::Barrier, at::Tensor())})
          .find("rank 1 called barrier"),
      std::string::npos);
  const Descriptor on_nccl = call(
      OpKind::Allreduce,
      f,
      "",
      static_cast<int>(ReduceOp::Sum),
      -1,
      "",
      "nccl");
  EXPECT_NE(
      verdict({sum_call(f, ""), on_nccl}).find("Float[3] on nccl"),
      std::string::npos);
}

TEST(Descriptor, AnyRanksComplaintRejectsTheCallEverywhere) {
  const at::Tensor t = at::zeros({2});
  const Descriptor bad = call(
      OpKind::Allreduce,
      t,
      "x",
      static_cast<int>(ReduceOp::Sum),
      -1,
      "dtype Bool is not supported");
  EXPECT_EQ(
      verdict({sum_call(t), bad}),
      "ronde: allreduce of 'x' rejected: rank 1: dtype Bool is not supported");
  // An undefined tensor is a complaint of its own.
  std::string none;
  const Descriptor undefined =
      describe(OpKind::Broadcast, at::Tensor(), "", -1, 0, "", none);
  EXPECT_EQ(none, "the tensor is undefined");
  EXPECT_EQ(
      verdict({undefined, undefined}),
      "ronde: broadcast rejected: rank 0: the tensor is undefined; rank 1: "
      "the tensor is undefined");
  // Beside a defined tensor it is a disagreement first.
  EXPECT_EQ(
      verdict({call(OpKind::Broadcast, t, "", -1, 0), undefined}),
      "ronde: ranks disagree on a collective (seen on rank 0): rank 0 called "
      "broadcast(root 0) Float[2]; rank 1 called broadcast(root 0) "
      "<undefined>");
}

TEST(Descriptor, PeerBytesWithoutTerminatorsStayInBounds) {
  const at::Tensor t = at::zeros({2});
  Descriptor mine = sum_call(t, "x");
  Descriptor theirs = mine;
  std::memset(theirs.name, 'n', sizeof(theirs.name));
  std::memset(theirs.error, 'e', sizeof(theirs.error));
  const std::string msg = verdict({mine, theirs});
  EXPECT_NE(
      msg.find("'" + std::string(sizeof(theirs.name), 'n') + "'"),
      std::string::npos)
      << msg;
}

TEST(Descriptor, TooManyDimensionsIsAComplaint) {
  std::string error;
  const Descriptor d = describe(
      OpKind::Allreduce,
      at::zeros(std::vector<int64_t>(17, 1)),
      "",
      0,
      -1,
      "",
      error);
  EXPECT_EQ(error, "tensors of more than 16 dimensions are not supported");
  EXPECT_EQ(d.ndim, ronde::detail::kMaxDims);
}

TEST(Descriptor, DescribedBytes) {
  EXPECT_EQ(ronde::detail::described_bytes(sum_call(at::zeros({3, 4}))), 48);
  EXPECT_EQ(
      ronde::detail::described_bytes(call(OpKind::Barrier, at::Tensor())), 0);
}

}  // namespace

namespace {

using ronde::detail::fingerprint;

TEST(Descriptor, FingerprintsTellCallsApartAsTheCheckDoes) {
  const at::Tensor t = at::zeros({4, 5});
  EXPECT_EQ(fingerprint(sum_call(t)), fingerprint(sum_call(at::ones({4, 5}))));
  EXPECT_NE(fingerprint(sum_call(t)), fingerprint(sum_call(at::zeros({4, 6}))));
  EXPECT_NE(fingerprint(sum_call(t)), fingerprint(sum_call(t, "y")));
  EXPECT_NE(
      fingerprint(sum_call(t)),
      fingerprint(
          call(OpKind::Allreduce, t, "x", static_cast<int>(ReduceOp::Max))));
  EXPECT_NE(
      fingerprint(sum_call(t)),
      fingerprint(sum_call(at::zeros({4, 5}, at::kDouble))));
  EXPECT_NE(
      fingerprint(call(OpKind::Broadcast, t, "x", -1, 0)),
      fingerprint(call(OpKind::Broadcast, t, "x", -1, 1)));
  // A ragged dim 0 and a complaint are not part of it.
  EXPECT_EQ(
      fingerprint(call(OpKind::Allgather, at::zeros({2, 3}), "g")),
      fingerprint(call(OpKind::Allgather, at::zeros({7, 3}), "g")));
  EXPECT_NE(
      fingerprint(call(OpKind::Allgather, at::zeros({2, 3}), "g")),
      fingerprint(call(OpKind::Allgather, at::zeros({2, 4}), "g")));
  EXPECT_EQ(
      fingerprint(sum_call(t)),
      fingerprint(call(
          OpKind::Allreduce,
          t,
          "x",
          static_cast<int>(ReduceOp::Sum),
          -1,
          "bad")));
}

TEST(Descriptor, FramesHoldFourKibUpToSixteenRanksAndStayAligned) {
  using ronde::detail::frame_bytes;
  using ronde::detail::inline_capacity;
  EXPECT_EQ(inline_capacity(2), 4096u);
  EXPECT_EQ(inline_capacity(16), 4096u);
  EXPECT_EQ(inline_capacity(64), 1024u);
  EXPECT_EQ(inline_capacity(4096), 512u);
  for (int n : {1, 2, 17, 33, 100, 1000})
    EXPECT_EQ(frame_bytes(n) % 8, 0u) << n;
}

TEST(Descriptor, FrameCodecCarriesHeaderAndPayloadAndZeroesTheRest) {
  using namespace ronde::detail;
  FrameHeader head;
  head.fingerprint = 0x1234;
  head.dim0 = 3;
  head.flags = kFrameInline | kFrameUnverified;
  head.inline_bytes = 5;
  std::vector<uint8_t> frame(sizeof(FrameHeader) + 16, 0xff);
  const char payload[] = "abcde";
  encode_frame(head, payload, frame.data(), frame.size());
  const FrameHeader back = decode_frame_header(frame.data(), 0);
  EXPECT_EQ(back.fingerprint, 0x1234u);
  EXPECT_EQ(back.dim0, 3);
  EXPECT_EQ(back.flags, kFrameInline | kFrameUnverified);
  EXPECT_EQ(back.inline_bytes, 5);
  EXPECT_EQ(std::memcmp(frame_payload(frame.data()), payload, 5), 0);
  for (size_t i = sizeof(FrameHeader) + 5; i < frame.size(); ++i)
    EXPECT_EQ(frame[i], 0) << i;

  frame[0] ^= 1;  // not a frame
  EXPECT_THROW(decode_frame_header(frame.data(), 2), c10::Error);
}

}  // namespace
