// The membership round of an elastic job: the decision rule, and survivors
// meeting in one store from threads, every one with the same outcome.
#include "runtime/membership.h"
#include "runtime/rendezvous.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using ronde::detail::decide_members;
using Arrivals = std::vector<std::pair<int, std::vector<int>>>;

TEST(Membership, WaitsForEveryMemberNobodySuspects) {
  const std::vector<int> previous = {0, 1, 2, 3};
  EXPECT_TRUE(
      decide_members(previous, Arrivals{{1, {3}}, {0, {3}}}, 1, false).empty());
  EXPECT_EQ(
      decide_members(previous, Arrivals{{1, {3}}, {0, {3}}, {2, {}}}, 1, false),
      (std::vector<int>{0, 1, 2}));
  // Waited out: whoever came, in their old order.
  EXPECT_EQ(
      decide_members(previous, Arrivals{{2, {}}, {1, {}}}, 2, true),
      (std::vector<int>{1, 2}));
}

TEST(Membership, KeepsTheOldOrderAndPutsNewMembersLast) {
  EXPECT_EQ(
      decide_members(
          {5, 2, 7}, Arrivals{{9, {}}, {7, {}}, {5, {}}, {2, {}}}, 1, false),
      (std::vector<int>{5, 2, 7, 9}));
}

TEST(Membership, NeedsTheMinimum) {
  EXPECT_TRUE(
      decide_members({0, 1, 2}, Arrivals{{0, {2}}, {1, {2}}}, 3, true).empty());
  // An arrival that died before saying who it was counts for nothing.
  EXPECT_TRUE(
      decide_members({0, 1}, Arrivals{{-1, {}}, {0, {1}}}, 2, true).empty());
}

ronde::detail::MembershipRequest request(
    int member, std::vector<int> suspects) {
  ronde::detail::MembershipRequest r;
  r.job_id = "membership-test";
  r.epoch = 1;
  r.member = member;
  r.previous = {0, 1, 2, 3};
  r.suspects = std::move(suspects);
  r.min_members = 2;
  r.timeout = std::chrono::milliseconds(5000);
  return r;
}

TEST(Membership, SurvivorsAgreeOnTheNewWorld) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<ronde::detail::Membership> out(3);
  std::vector<std::thread> threads;
  const std::vector<int> survivors = {3, 0, 2};  // 1 died
  for (size_t i = 0; i < survivors.size(); ++i) {
    threads.emplace_back([&, i] {
      out[i] = ronde::detail::meet_members(*store, request(survivors[i], {1}));
    });
  }
  for (auto& t : threads)
    t.join();
  for (size_t i = 0; i < survivors.size(); ++i) {
    EXPECT_EQ(out[i].members, (std::vector<int>{0, 2, 3}));
    EXPECT_EQ(out[i].members[out[i].rank], survivors[i]);
  }
}

TEST(Membership, TooFewWithinTheTimeoutIsAnError) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto r = request(0, {1, 2, 3});
  r.min_members = 2;
  r.timeout = std::chrono::milliseconds(200);
  try {
    ronde::detail::meet_members(*store, r);
    FAIL() << "one rank formed a world with a minimum of two";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("fewer than the job's minimum of 2"),
        std::string::npos)
        << e.what();
  }
}

// Short of the minimum, the survivors admit the joiner that waits, and the
// round forms with it (the replacement of a rank below --min-np).
TEST(Membership, ARoundShortOfTheMinimumAdmitsAWaitingJoiner) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<ronde::detail::Membership> out(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto r = request(i, {2, 3});
      r.min_members = 3;
      out[i] = ronde::detail::meet_members(*store, r);
    });
  }
  threads.emplace_back([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ronde::detail::post_joiner(*store, "membership-test", 7);
    const int64_t epoch = ronde::detail::wait_admission(
        *store, "membership-test", 7, std::chrono::milliseconds(5000));
    ASSERT_EQ(epoch, 1);
    auto expected = ronde::detail::expected_members(
        *store, "membership-test", 1, std::chrono::milliseconds(5000));
    auto r = request(7, {});
    r.previous = expected.first;
    r.joining = expected.second;
    r.min_members = 3;
    out[2] = ronde::detail::meet_members(*store, r);
  });
  for (auto& t : threads)
    t.join();
  for (const auto& m : out)
    EXPECT_EQ(m.members, (std::vector<int>{0, 1, 7}));
  EXPECT_EQ(out[2].rank, 2);
  EXPECT_EQ(ronde::detail::pending_joiners(*store, "membership-test"), 0);
}

// A rank that saw a peer exit says so in its failure notice: the others
// suspect that peer at once, without waiting out the 3 s grace for it.
TEST(Membership, AnExitSeenByOnePeerEndsEveryonesGrace) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  ronde::detail::LaunchInfo info;
  info.job_id = "membership-test";
  info.size = 3;
  info.rank = 1;
  // Rank 1 saw rank 2's process exit.
  EXPECT_EQ(
      ronde::detail::failed_peers(
          *store, info, std::chrono::milliseconds(300), {}, {2}),
      (std::vector<int>{0, 2}));  // rank 0 had not posted: the grace ran out
  info.rank = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(
      ronde::detail::failed_peers(
          *store, info, std::chrono::milliseconds(60000)),
      std::vector<int>{2});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2))
      << "waited the grace for a rank known to have exited";
}

}  // namespace
