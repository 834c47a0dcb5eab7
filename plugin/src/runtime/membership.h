// The membership round of an elastic job: after a failure (or when ranks
// wait to join), the members meet in the store under the next membership
// epoch and agree on who is in it. The first decision written wins, so
// every rank leaves the round with the same members, in the same order.
// Joining: a process started into the running job posts its member id and
// waits; rank 0 sees it at a commit and admits it to the next epoch.
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
  // Members new to the job that the round waits for (admitted joiners).
  std::vector<int> joining;
  int min_members = 1;
  // How long to wait for a member that nobody suspects, and for
  // min_members to arrive.
  std::chrono::milliseconds timeout{30000};
  // "address:port" of the store, and whether it outlives every rank
  // (ronderun --min-np): then losing it means this host is cut off.
  std::string store_address;
  bool store_outlives_ranks = false;
};

struct Membership {
  std::vector<int> members;  // member ids; a member's new rank is its index
  int rank = -1;             // this member's new rank; -1: left out
};

// The round's decision from what arrived (pure, unit tested): the members,
// in the order of `previous` (members new to the job after them, by id),
// once every expected member (previous, less every arrival's suspects, and
// `joining`) is there and at least `min_members` are; with `waited_out`,
// whatever arrived if that is at least min_members. Empty: wait on.
std::vector<int> decide_members(
    const std::vector<int>& previous,
    const std::vector<std::pair<int, std::vector<int>>>& arrivals,
    int min_members,
    bool waited_out,
    const std::vector<int>& joining = {});

// Joins the round and returns its outcome. Throws std::runtime_error with
// the reason when fewer than min_members arrive within the timeout, or when
// the store cannot be reached (a store hosted by a rank that died, or one
// this host is cut off from).
Membership meet_members(c10d::Store& store, const MembershipRequest& request);

// While a round cannot reach min_members (the previous members nobody
// suspects, and the joiners, are too few): admits the joiners waiting (one
// arrival does, once per round) to the epoch being formed, and adds them
// to `joining`, so that the round waits for them too. False when nobody
// was waiting and the round admitted nobody yet.
bool admit_while_short(
    c10d::Store& store,
    const MembershipRequest& request,
    std::vector<int>& joining);
// A joining process says it is there (its member id).
void post_joiner(c10d::Store& store, const std::string& job_id, int member);
// Blocks until `member` is admitted, and returns the epoch it joins; -1
// when the job closed to joiners first (its training is over). Throws
// std::runtime_error after `patience`.
int64_t wait_admission(
    c10d::Store& store,
    const std::string& job_id,
    int member,
    std::chrono::milliseconds patience);
// Joiners posted and not yet admitted (rank 0 asks, at a commit).
int64_t pending_joiners(c10d::Store& store, const std::string& job_id);
// Rank 0: admits every pending joiner to `epoch` and writes what that
// epoch's round expects (`previous` and the joiners); returns the joiners.
std::vector<int> admit_joiners(
    c10d::Store& store,
    const std::string& job_id,
    uint64_t epoch,
    const std::vector<int>& previous);
// What rank 0 wrote for `epoch` (the previous members, the joiners).
std::pair<std::vector<int>, std::vector<int>> expected_members(
    c10d::Store& store,
    const std::string& job_id,
    uint64_t epoch,
    std::chrono::milliseconds timeout);
// Rank 0, once training is over: joiners still waiting leave.
void close_to_joiners(c10d::Store& store, const std::string& job_id);

}  // namespace ronde::detail
