// The membership round: arrivals are numbered by a counter, each writes its
// member id and suspects under its number, and the first arrival that finds
// the round complete claims the decision (a second counter) and writes it.
#include "runtime/membership.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ronde::detail {
namespace {

std::string elastic_key(const std::string& job_id, const std::string& suffix) {
  return "ronde/" + job_id + "/elastic/" + suffix;
}

std::string round_key(const MembershipRequest& r, const std::string& suffix) {
  return elastic_key(r.job_id, std::to_string(r.epoch) + "/" + suffix);
}

// What rank 0 wrote an epoch's round expects (admit_joiners()).
std::string expected_key(const std::string& job_id, uint64_t epoch) {
  return elastic_key(job_id, std::to_string(epoch) + "/expected");
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<int> split_ints(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty())
      out.push_back(std::stoi(item));
  }
  return out;
}

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string text(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

// An epoch's "expected" value, "previous;joining": the two lists.
std::pair<std::vector<int>, std::vector<int>> split_expected(
    const std::string& value) {
  const size_t semi = value.find(';');
  return {
      split_ints(value.substr(0, semi)),
      split_ints(semi == std::string::npos ? "" : value.substr(semi + 1))};
}

// How many members the round can have at most: the previous ones nobody
// suspects, the joiners, and whoever else arrived.
int can_reach(
    const std::vector<int>& previous,
    const std::vector<std::pair<int, std::vector<int>>>& arrivals,
    const std::vector<int>& joining) {
  std::set<int> suspected, members(joining.begin(), joining.end());
  for (const auto& [member, suspects] : arrivals) {
    suspected.insert(suspects.begin(), suspects.end());
    if (member >= 0)
      members.insert(member);
  }
  for (int m : previous) {
    if (!suspected.count(m))
      members.insert(m);
  }
  return static_cast<int>(members.size());
}

}  // namespace

std::vector<int> decide_members(
    const std::vector<int>& previous,
    const std::vector<std::pair<int, std::vector<int>>>& arrivals,
    int min_members,
    bool waited_out,
    const std::vector<int>& joining) {
  std::set<int> arrived, suspected;
  for (const auto& [member, suspects] : arrivals) {
    if (member < 0)
      continue;  // died before it said who it was
    arrived.insert(member);
    suspected.insert(suspects.begin(), suspects.end());
  }
  bool complete = true;
  for (int m : previous) {
    if (!suspected.count(m) && !arrived.count(m))
      complete = false;
  }
  for (int m : joining) {
    if (!arrived.count(m))
      complete = false;
  }
  if (static_cast<int>(arrived.size()) < min_members ||
      (!complete && !waited_out)) {
    return {};
  }
  std::vector<int> members;
  for (int m : previous) {
    if (arrived.count(m))
      members.push_back(m);
  }
  for (int m : arrived) {  // ascending: new members after the known ones
    if (std::find(previous.begin(), previous.end(), m) == previous.end())
      members.push_back(m);
  }
  return members;
}

Membership meet_members(c10d::Store& store, const MembershipRequest& r) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + r.timeout;
  const std::string members_key = round_key(r, "members");
  std::vector<std::pair<int, std::vector<int>>> arrivals;
  std::vector<int> joining = r.joining;
  bool admitted = false;
  auto next_admission_check = start;
  try {
    const int64_t index = store.add(round_key(r, "arrivals"), 1) - 1;
    store.set(
        round_key(r, "arrival/" + std::to_string(index)),
        bytes(std::to_string(r.member) + ";" + join_ints(r.suspects)));
    std::string decided;
    for (;;) {
      if (store.check({members_key})) {
        decided = text(store.get(members_key));
        break;
      }
      const int64_t count = store.add(round_key(r, "arrivals"), 0);
      for (int64_t i = static_cast<int64_t>(arrivals.size()); i < count; ++i) {
        const std::string key = round_key(r, "arrival/" + std::to_string(i));
        // Numbered before it wrote: give it a moment, and count it out
        // when it died in between.
        try {
          store.wait({key}, std::chrono::milliseconds(2000));
        } catch (const std::exception&) {
          if (!store.check({key})) {
            arrivals.emplace_back(-1, std::vector<int>{});
            continue;
          }
        }
        const std::string value = text(store.get(key));
        const size_t semi = value.find(';');
        arrivals.emplace_back(
            std::stoi(value.substr(0, semi)),
            split_ints(
                semi == std::string::npos ? "" : value.substr(semi + 1)));
      }
      const auto now = std::chrono::steady_clock::now();
      const bool waited_out = now >= deadline;
      if (!admitted && now >= next_admission_check &&
          can_reach(r.previous, arrivals, joining) < r.min_members) {
        next_admission_check = now + std::chrono::milliseconds(50);
        admitted = admit_while_short(store, r, joining);
      }
      const std::vector<int> members = decide_members(
          r.previous, arrivals, r.min_members, waited_out, joining);
      if (!members.empty()) {
        if (store.add(round_key(r, "claim"), 1) == 1)
          store.set(members_key, bytes(join_ints(members)));
        continue;  // read back whichever decision was written
      }
      if (waited_out) {
        std::set<int> arrived;
        for (const auto& a : arrivals) {
          if (a.first >= 0)
            arrived.insert(a.first);
        }
        throw std::runtime_error(
            "only " + std::to_string(arrived.size()) + " rank(s) (" +
            join_ints(std::vector<int>(arrived.begin(), arrived.end())) +
            ", by launch rank) are left, fewer than the job's minimum of " +
            std::to_string(r.min_members) +
            " (RONDE_ELASTIC_MIN_NP, "
            "ronderun --min-np); waited " +
            std::to_string(r.timeout.count() / 1000.0) + " s for more");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    Membership out;
    out.members = split_ints(decided);
    for (size_t i = 0; i < out.members.size(); ++i) {
      if (out.members[i] == r.member)
        out.rank = static_cast<int>(i);
    }
    return out;
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    if (r.store_outlives_ranks) {
      throw std::runtime_error(
          "lost contact with the store at " + r.store_address + " (" +
          e.what() +
          "); that store outlives every rank, so this host may be "
          "partitioned from the job's network: this rank cannot rejoin");
    }
    throw std::runtime_error(
        std::string("the store is gone (") + e.what() +
        "); a store hosted by a rank dies with it: run the job under "
        "ronderun --min-np, whose store outlives every rank");
  }
}

bool admit_while_short(
    c10d::Store& store, const MembershipRequest& r, std::vector<int>& joining) {
  const std::string expected = expected_key(r.job_id, r.epoch);
  if (!store.check({expected})) {
    // One arrival admits, once per round; the others read what it wrote.
    if (pending_joiners(store, r.job_id) == 0 ||
        store.add(round_key(r, "admission"), 1) != 1)
      return false;
    admit_joiners(store, r.job_id, r.epoch, r.previous);
  }
  for (int m : split_expected(text(store.get(expected))).second) {
    if (std::find(joining.begin(), joining.end(), m) == joining.end())
      joining.push_back(m);
  }
  return true;
}

void post_joiner(c10d::Store& store, const std::string& job_id, int member) {
  const int64_t index = store.add(elastic_key(job_id, "joiners"), 1) - 1;
  store.set(
      elastic_key(job_id, "joiner/" + std::to_string(index)),
      bytes(std::to_string(member)));
}

int64_t wait_admission(
    c10d::Store& store,
    const std::string& job_id,
    int member,
    std::chrono::milliseconds patience) {
  const std::string admit =
      elastic_key(job_id, "admit/" + std::to_string(member));
  const std::string closed = elastic_key(job_id, "closed");
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error(
          "no member admitted it within " +
          std::to_string(patience.count() / 1000) +
          " s (20 times the timeout): the job commits too rarely, or has no "
          "members left");
    }
    if (store.check({admit}))
      return std::stoll(text(store.get(admit)));
    if (store.check({closed}))
      return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int64_t pending_joiners(c10d::Store& store, const std::string& job_id) {
  return store.add(elastic_key(job_id, "joiners"), 0) -
         store.add(elastic_key(job_id, "admitted"), 0);
}

std::vector<int> admit_joiners(
    c10d::Store& store,
    const std::string& job_id,
    uint64_t epoch,
    const std::vector<int>& previous) {
  const int64_t posted = store.add(elastic_key(job_id, "joiners"), 0);
  const int64_t admitted = store.add(elastic_key(job_id, "admitted"), 0);
  std::vector<int> joining;
  for (int64_t i = admitted; i < posted; ++i) {
    const std::string key = elastic_key(job_id, "joiner/" + std::to_string(i));
    store.wait({key}, std::chrono::milliseconds(2000));
    const int member = std::stoi(text(store.get(key)));
    if (std::find(previous.begin(), previous.end(), member) == previous.end())
      joining.push_back(member);
  }
  store.set(
      expected_key(job_id, epoch),
      bytes(join_ints(previous) + ";" + join_ints(joining)));
  for (int member : joining) {
    store.set(
        elastic_key(job_id, "admit/" + std::to_string(member)),
        bytes(std::to_string(epoch)));
  }
  store.add(elastic_key(job_id, "admitted"), posted - admitted);
  return joining;
}

std::pair<std::vector<int>, std::vector<int>> expected_members(
    c10d::Store& store,
    const std::string& job_id,
    uint64_t epoch,
    std::chrono::milliseconds timeout) {
  const std::string key = expected_key(job_id, epoch);
  store.wait({key}, timeout);
  return split_expected(text(store.get(key)));
}

void close_to_joiners(c10d::Store& store, const std::string& job_id) {
  store.set(elastic_key(job_id, "closed"), bytes("1"));
}

}  // namespace ronde::detail
