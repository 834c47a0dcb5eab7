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

std::string round_key(const MembershipRequest& r, const std::string& suffix) {
  return "ronde/" + r.job_id + "/elastic/" + std::to_string(r.epoch) + "/" +
      suffix;
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

}  // namespace

std::vector<int> decide_members(
    const std::vector<int>& previous,
    const std::vector<std::pair<int, std::vector<int>>>& arrivals,
    int min_members,
    bool waited_out) {
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
            split_ints(semi == std::string::npos ? "" : value.substr(semi + 1)));
      }
      const bool waited_out = std::chrono::steady_clock::now() >= deadline;
      const std::vector<int> members =
          decide_members(r.previous, arrivals, r.min_members, waited_out);
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
            std::to_string(r.min_members) + " (RONDE_ELASTIC_MIN_NP, "
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
    throw std::runtime_error(
        std::string("the store is gone (") + e.what() +
        "); a store hosted by a rank dies with it: run the job under "
        "ronderun --min-np, whose store outlives every rank");
  }
}

}  // namespace ronde::detail
