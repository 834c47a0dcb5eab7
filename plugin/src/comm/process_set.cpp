// Process sets (ronde/process_set.h): creating and removing them, as
// collectives of the whole job on the global set, and connecting each set's
// communicator the way the job's own was connected, under its own prefix.
#include <ronde/process_set.h>

#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/runtime.h>

#include "comm/text_exchange.h"
#include "comm/world.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <sstream>

namespace ronde {
namespace detail {
namespace {

// Exchanges this rank's request (`mine`, with a leading '!' when this rank
// found it invalid) through the global set, and throws the same c10::Error
// on every rank unless every rank made the same valid request: the
// request's own fault when every rank made it alike, else what each asked.
void agree_on_request(const char* what, const std::string& mine) {
  World& w = world(what);
  const std::vector<std::string> all = allgather_texts(
      mine, CollectiveOptions().name(std::string("ronde.") + what));
  bool same = true;
  for (const auto& t : all)
    same = same && t == all[0];
  const bool invalid = !all[0].empty() && all[0][0] == '!';
  if (same && !invalid)
    return;
  TORCH_CHECK(!same, "ronde: ", what, ": ", all[0].substr(1));
  const int me = w.rank;
  std::ostringstream os;
  os << "ronde: " << what
     << ": the ranks did not all make the same call (every rank of the job "
        "calls it, with the same ranks; seen on rank "
     << me << "):";
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string& t = all[r];
    os << (r ? ";" : "") << " rank " << r << " "
       << (!t.empty() && t[0] == '!' ? t.substr(1) : t);
  }
  TORCH_CHECK(false, os.str());
}

// What is wrong with `ranks` as a set of a job of `size` ranks; empty when
// nothing is.
std::string invalid_ranks(const std::vector<int>& ranks, int size) {
  if (ranks.empty())
    return "a process set needs at least one rank";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size) {
      return "rank " + std::to_string(ranks[i]) + " is outside [0, " +
             std::to_string(size) + ")";
    }
    if (i > 0 && ranks[i] == ranks[i - 1])
      return "rank " + std::to_string(ranks[i]) + " appears twice";
  }
  return "";
}

// Connects this rank's communicator and worker for `g` (a member), under
// the store prefix `prefix`, as `config` says.
void connect(
    World& w, Group& g, const std::string& prefix, const CommConfig& config) {
  CommGroup group;
  group.prefix = prefix;
  group.rank = g.rank;
  group.size = g.size;
  if (!w.group.hosts.empty()) {
    for (int r : g.ranks)
      group.hosts.push_back(w.group.hosts[r]);
  }
  try {
    g.comm = make_communicator(config, group);
  } catch (const BackendFailure& e) {
    const World::Suspects suspects =
        w.failed_peers ? w.failed_peers(g.ranks, {}) : World::Suspects{};
    throw CommError(
        CommError::Kind::Rendezvous,
        "add_process_set",
        "process set " + std::to_string(g.id) + " " + rank_list(g.ranks),
        w.rank,
        suspects.ranks,
        w.global->comm->backend(),
        e.what() + suspects.note);
  }
  g.worker = std::make_unique<CommWorker>(*g.comm, w.blocking_wait);
}

// Numbers the set, registers it as an added set and connects it where this
// rank is a member, under the store prefix `prefix` (`%` there becomes the
// id); a failure leaves it unregistered.
void register_and_connect(
    World& w,
    const ProcessSet& set,
    std::string prefix,
    const CommConfig& config) {
  Group& g = *set.group();
  {
    std::lock_guard<std::mutex> lock(w.sets_mutex);
    g.id = w.next_set_id++;
    w.sets[g.id] = set.group();
  }
  if (auto at = prefix.find('%'); at != std::string::npos)
    prefix.replace(at, 1, std::to_string(g.id));
  g.epoch = w.epoch;
  g.size = static_cast<int>(g.ranks.size());
  auto it = std::find(g.ranks.begin(), g.ranks.end(), w.rank);
  g.rank = it == g.ranks.end() ? -1 : static_cast<int>(it - g.ranks.begin());
  g.verified_calls.clear();
  if (g.rank < 0)
    return;
  try {
    connect(w, g, prefix, config);
  } catch (...) {
    std::lock_guard<std::mutex> lock(w.sets_mutex);
    w.sets.erase(g.id);
    g.id = -1;
    throw;
  }
}

}  // namespace

ProcessSet add_member_set(
    const std::vector<int>& ranks, const std::string& key) {
  World& w = world("add_member_set");
  ProcessSet set(ranks);
  const Group& g = *set.group();
  const std::string invalid = invalid_ranks(g.ranks, w.size);
  TORCH_CHECK(
      invalid.empty(),
      "ronde: process group '",
      key,
      "' ",
      rank_list(g.ranks),
      ": ",
      invalid);
  TORCH_CHECK(
      std::binary_search(g.ranks.begin(), g.ranks.end(), w.rank),
      "ronde: process group '",
      key,
      "' ",
      rank_list(g.ranks),
      " created on rank ",
      w.rank,
      ", which is not in it");
  // A key has no '%': torch's group names are digits, or hashes in hex.
  TORCH_CHECK(
      key.find('%') == std::string::npos && key.find('/') == std::string::npos,
      "ronde: process group name '",
      key,
      "' has '%' or '/'");
  int use = 0;
  {
    std::lock_guard<std::mutex> lock(w.sets_mutex);
    use = w.member_set_keys[key]++;
  }
  // A connection of its own to the store: members connect sets on
  // threads of their own (c10d/p2p.h), and a store client serves one
  // blocking wait at a time.
  CommConfig config = w.config;
  if (config.store)
    config.store = config.store->clone();
  register_and_connect(
      w,
      set,
      w.group.prefix + "group/" + key + "." + std::to_string(use) + "/",
      config);
  return set;
}

void drop_member_set(const ProcessSet& set) {
  if (set.is_global() || !is_initialized())
    return;
  World& w = world("drop_member_set");
  Group& g = *set.group();
  if (g.id <= 0 || g.epoch != w.epoch)
    return;
  g.worker.reset();
  g.comm.reset();
  std::lock_guard<std::mutex> lock(w.sets_mutex);
  w.sets.erase(g.id);
  g.id = -1;
}

void stop_added_sets(World& w) {
  std::lock_guard<std::mutex> lock(w.sets_mutex);
  for (auto& [id, g] : w.sets) {
    (void)id;
    g->worker.reset();
  }
}

void interrupt_all_sets(World& w) {
  if (w.global && w.global->comm)
    w.global->comm->interrupt();
  std::lock_guard<std::mutex> lock(w.sets_mutex);
  for (auto& [id, g] : w.sets) {
    (void)id;
    if (g->comm)
      g->comm->interrupt();
  }
}

void close_added_sets(World& w) {
  std::lock_guard<std::mutex> lock(w.sets_mutex);
  for (auto& [id, g] : w.sets) {
    (void)id;
    g->worker.reset();
    g->comm.reset();
    g->id = -1;
  }
  w.sets.clear();
}

}  // namespace detail

ProcessSet::ProcessSet() = default;

ProcessSet::ProcessSet(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  group_ = std::make_shared<detail::Group>(std::move(ranks));
}

ProcessSet ProcessSet::from_group(std::shared_ptr<detail::Group> group) {
  ProcessSet s;
  s.group_ = std::move(group);
  return s;
}

int ProcessSet::id() const {
  return group_ ? group_->id : 0;
}

std::vector<int> ProcessSet::ranks() const {
  if (group_)
    return group_->ranks;
  return detail::world("ProcessSet::ranks").global->ranks;
}

bool ProcessSet::included() const {
  detail::World& w = detail::world("ProcessSet::included");
  if (!group_)
    return true;
  return std::binary_search(group_->ranks.begin(), group_->ranks.end(), w.rank);
}

int ProcessSet::rank() const {
  return detail::group_of(*this, "ProcessSet::rank").rank;
}

int ProcessSet::size() const {
  return detail::group_of(*this, "ProcessSet::size").size;
}

bool ProcessSet::operator==(const ProcessSet& other) const {
  if (is_global() || other.is_global())
    return is_global() && other.is_global();
  return group_ == other.group_ || (id() > 0 && id() == other.id());
}

ProcessSet global_process_set() {
  return ProcessSet();
}

ProcessSet add_process_set(const std::vector<int>& ranks) {
  return add_process_set(ProcessSet(ranks));
}

ProcessSet add_process_set(const ProcessSet& set) {
  detail::World& w = detail::world("add_process_set");
  TORCH_CHECK(
      !set.is_global(),
      "ronde: add_process_set: the global process set exists already");
  detail::Group& g = *set.group();
  TORCH_CHECK(
      !(g.id > 0 && g.epoch == w.epoch),
      "ronde: add_process_set: process set ",
      g.id,
      " ",
      detail::rank_list(g.ranks),
      " was created already");
  std::string mine = detail::rank_list(g.ranks);
  const std::string invalid = detail::invalid_ranks(g.ranks, w.size);
  if (!invalid.empty())
    mine = "!" + mine + " (" + invalid + ")";
  detail::agree_on_request("add_process_set", mine);
  // Ids count alike on every rank: every rank creates every added set.
  detail::register_and_connect(w, set, w.group.prefix + "set/%/", w.config);
  return set;
}

void remove_process_set(const ProcessSet& set) {
  detail::World& w = detail::world("remove_process_set");
  TORCH_CHECK(
      !set.is_global(),
      "ronde: remove_process_set: the global process set cannot be removed");
  detail::Group& g = *set.group();
  std::string mine;
  if (g.id > 0 && g.epoch == w.epoch) {
    mine = "remove " + std::to_string(g.id) + " " + detail::rank_list(g.ranks);
  } else {
    mine = "!remove " + detail::rank_list(g.ranks) +
           " (not a process set of the job)";
  }
  detail::agree_on_request("remove_process_set", mine);
  // Members finish what they queued on the set; the barrier then tells
  // every rank that every member has, so no connection closes under a
  // peer still using it.
  g.worker.reset();
  if (w.size > 1)
    barrier();
  g.comm.reset();
  std::lock_guard<std::mutex> lock(w.sets_mutex);
  w.sets.erase(g.id);
  g.id = -1;
}

std::vector<ProcessSet> process_sets() {
  detail::World& w = detail::world("process_sets");
  std::vector<ProcessSet> out{ProcessSet()};
  std::lock_guard<std::mutex> lock(w.sets_mutex);
  for (const auto& [id, g] : w.sets) {
    (void)id;
    out.push_back(ProcessSet::from_group(g));
  }
  return out;
}

}  // namespace ronde
