// The membership round of an elastic job: after a failure, the survivors
// meet in the store under the next membership epoch and agree on who is
// left. The first proposal written wins (compare-and-set), so every rank
// leaves the round with the same members, in the same order.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace ronde::detail {

struct MembershipRequest {
  std::string job_id;
  uint64_t epoch = 0;  // the epoch being formed
  // This process's member id: its rank at launch, which it keeps for life.
  int member = 0;
  // The members of the epoch that failed, in their rank order there.
  std::vector<int> previous;
  // Members of `previous` that this rank saw fail (a failed collective's
  // suspects): the round does not wait for them.
  std::vector<int> suspects;
  int min_members = 1;
  // How long to wait for a member that nobody suspects, and for
  // min_members to arrive.
  std::chrono::milliseconds timeout{30000};
};

struct Membership {
  std::vector<int> members;  // member ids; a member's new rank is its index
  int rank = -1;             // this member's new rank; -1: left out
};

// The round's decision from what arrived (pure, unit tested): the members,
// in the order of `previous` (members new to the job after them, by id),
// once every expected member (previous, less every arrival's suspects) is
// there and at least `min_members` are; with `waited_out`, whatever
// arrived if that is at least min_members. Empty: wait on.
std::vector<int> decide_members(
    const std::vector<int>& previous,
    const std::vector<std::pair<int, std::vector<int>>>& arrivals,
    int min_members,
    bool waited_out);

// Joins the round and returns its outcome. Throws std::runtime_error with
// the reason when fewer than min_members arrive within the timeout, or when
// the store cannot be reached (a store hosted by a rank that died).
Membership meet_members(c10d::Store& store, const MembershipRequest& request);

}  // namespace ronde::detail
