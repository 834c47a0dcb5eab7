// The changes of world of an elastic job (ronde/runtime.h, namespace
// elastic): after a failure, the survivors drop this world and form the
// next; at a commit, waiting joiners are admitted to the next; a joiner
// waits for its admission. Each ends in connect(), as init() does. See
// docs/elastic.md.
#include "init/runtime.h"

#include "comm/shm/shm_transport.h"
#include "comm/world.h"
#include "runtime/error_text.h"
#include "runtime/membership.h"
#include "runtime/rendezvous.h"
#include "runtime/signed_store.h"

#include <ronde/collectives.h>
#include <ronde/errors.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ronde {
namespace detail {
namespace {

// The first half of a change of world: every communicator of the epoch
// goes, without the barrier shutdown() holds (peers are dead), and so do
// the segments of dead ranks on this host.
void abandon_world(Runtime& rt) {
  World& w = world("elastic change of world");
  rt.inspector.reset();
  interrupt_all_sets(w);
  close_added_sets(w);
  w.global->worker.reset();
  const std::string shm_dir = w.config.shm.tuning.dir;
  remove_world().reset();
  rt.store.reset();
  // This process owns no segment any more: the sweep cannot drop its lock.
  shm::remove_stale_segments(shm_dir);
}

// Leaves the process as before init(), after a change of world failed.
void give_up(std::unique_ptr<Runtime> rt) {
  release(*rt);
}

// The store as the membership keys see it: sealed with a key derived from
// the job key when the job is authenticated, each value tagged with the
// writer's member id. Made once per process.
c10d::Store& elastic_store(Runtime& rt, const Settings& settings) {
  if (rt.elastic_store)
    return *rt.elastic_store;
  if (!rt.connection) {
    TORCH_CHECK(
        rt.info.store_hosted || rt.info.size > 1,
        "ronde: a process joining an elastic job needs the store ronderun "
        "--min-np hosts (RONDE_STORE_HOSTED=1)");
    rt.connection = connect_store(rt.info, settings, rt.timeout);
  }
  if (!rt.job_key)
    rt.job_key = load_job_key(rt.info, job_secret_file(rt, settings));
  if (rt.job_key) {
    rt.elastic_store = c10::make_intrusive<SignedStore>(
        rt.connection,
        run_key(*rt.job_key, "ronde elastic membership"),
        rt.member);
  } else {
    rt.elastic_store = rt.connection;
  }
  return *rt.elastic_store;
}

CommError change_error(
    const LaunchInfo& info, int member, const std::string& why) {
  return rendezvous_error(
      info,
      "rank " + std::to_string(info.rank) + " (launch rank " +
          std::to_string(member) + "): " + why);
}

// The round, then the new world: what every change of world ends with.
// Takes the runtime out of g_runtime for the duration; on failure leaves
// ronde shut down in this process and throws.
elastic::WorldChange form_world(
    std::unique_ptr<Runtime> rt,
    const Settings& settings,
    MembershipRequest request) {
  elastic::WorldChange change;
  change.old_rank = rt->info.rank;
  change.old_size = rt->info.size;
  Membership next;
  try {
    next = meet_members(elastic_store(*rt, settings), request);
  } catch (const std::exception& e) {
    const LaunchInfo info = rt->info;
    give_up(std::move(rt));
    throw change_error(
        info,
        request.member,
        "could not form epoch " + std::to_string(request.epoch) + ": " +
            error_text(e));
  }
  if (next.rank < 0) {
    const LaunchInfo info = rt->info;
    give_up(std::move(rt));
    throw change_error(
        info,
        request.member,
        "was left out of epoch " + std::to_string(request.epoch) +
            " (it came after the others had agreed on " +
            rank_list(next.members) + ")");
  }
  rt->info.epoch = request.epoch;
  rt->info.rank = next.rank;
  rt->info.size = static_cast<int>(next.members.size());
  rt->members = next.members;
  rt->joining = false;
  std::unique_ptr<World> w;
  try {
    w = connect(*rt, rt->options, settings);
  } catch (...) {
    give_up(std::move(rt));
    throw;
  }
  bring_up(*rt, settings, std::move(w));
  change.epoch = static_cast<int64_t>(rt->info.epoch);
  change.rank = rt->info.rank;
  change.size = rt->info.size;
  change.members = rt->members;
  g_runtime = rt.release();
  return change;
}

MembershipRequest next_round(const Runtime& rt, const Settings& settings) {
  MembershipRequest request;
  request.job_id = rt.info.job_id;
  request.epoch = rt.info.epoch + 1;
  request.member = rt.member;
  request.previous = rt.members;
  request.min_members = settings.elastic_min_ranks;
  request.timeout = rt.timeout;
  request.store_address = rt.info.addr + ":" + std::to_string(rt.info.port);
  request.store_outlives_ranks = rt.info.store_hosted;
  return request;
}

std::unique_ptr<Runtime> take_runtime(const char* what) {
  TORCH_CHECK(
      g_runtime != nullptr,
      "ronde::elastic::",
      what,
      "() needs ronde::init() first");
  std::unique_ptr<Runtime> rt(g_runtime);
  g_runtime = nullptr;
  return rt;
}

}  // namespace
}  // namespace detail

elastic::WorldChange elastic::change_world(const std::vector<int>& suspects) {
  using namespace detail;
  std::lock_guard<std::mutex> lock(g_init_mutex);
  std::unique_ptr<Runtime> rt = take_runtime("change_world");
  const Settings settings = detail::settings();
  MembershipRequest request = next_round(*rt, settings);
  for (int r : suspects) {
    if (r >= 0 && r < static_cast<int>(rt->members.size()) &&
        r != rt->info.rank)
      request.suspects.push_back(rt->members[r]);
  }
  abandon_world(*rt);
  return form_world(std::move(rt), settings, std::move(request));
}

bool elastic::check_host_updates() {
  using namespace detail;
  TORCH_CHECK(
      is_initialized(), "ronde::elastic::check_host_updates() needs init()");
  int64_t pending = 0;
  if (rank() == 0) {
    std::lock_guard<std::mutex> lock(g_init_mutex);
    const Settings settings = detail::settings();
    try {
      pending = pending_joiners(
          elastic_store(*g_runtime, settings), g_runtime->info.job_id);
    } catch (const std::exception&) {
      pending = 0;  // no store to join through: nobody can be waiting
    }
  }
  if (size() > 1) {
    at::Tensor t = at::tensor({pending}, at::kLong);
    broadcast_(t, 0, CollectiveOptions().name("ronde.elastic.joiners"));
    pending = t.item<int64_t>();
  }
  return pending > 0;
}

elastic::WorldChange elastic::admit_joiners() {
  using namespace detail;
  std::lock_guard<std::mutex> lock(g_init_mutex);
  std::unique_ptr<Runtime> rt = take_runtime("admit_joiners");
  const Settings settings = detail::settings();
  MembershipRequest request = next_round(*rt, settings);
  try {
    c10d::Store& store = elastic_store(*rt, settings);
    if (rt->info.rank == 0) {
      request.joining = detail::admit_joiners(
          store, rt->info.job_id, request.epoch, rt->members);
    } else {
      request.joining =
          expected_members(store, rt->info.job_id, request.epoch, rt->timeout)
              .second;
    }
  } catch (const std::exception& e) {
    const LaunchInfo info = rt->info;
    g_runtime = rt.release();
    throw change_error(
        info, request.member, "could not admit joiners: " + error_text(e));
  }
  // Every member takes part: the world is left whole, then formed again.
  World& w = world("admit_joiners");
  if (w.global && w.global->worker && rt->info.size > 1) {
    try {
      barrier(w, "barrier before admitting joiners");
    } catch (const std::exception&) {
      // A member died meanwhile: the round leaves it out.
    }
  }
  abandon_world(*rt);
  return form_world(std::move(rt), settings, std::move(request));
}

bool elastic::joining() {
  std::lock_guard<std::mutex> lock(detail::g_init_mutex);
  return detail::g_runtime != nullptr && detail::g_runtime->joining;
}

elastic::WorldChange elastic::join_world() {
  using namespace detail;
  std::lock_guard<std::mutex> lock(g_init_mutex);
  TORCH_CHECK(
      g_runtime != nullptr && g_runtime->joining,
      "ronde::elastic::join_world() is for a process ronderun started into "
      "a running elastic job (RONDE_ELASTIC_JOIN)");
  std::unique_ptr<Runtime> rt = take_runtime("join_world");
  const Settings settings = detail::settings();
  MembershipRequest request = next_round(*rt, settings);
  int64_t epoch = -1;
  try {
    c10d::Store& store = elastic_store(*rt, settings);
    post_joiner(store, rt->info.job_id, rt->member);
    epoch =
        wait_admission(store, rt->info.job_id, rt->member, 20 * rt->timeout);
    if (epoch >= 0) {
      auto expected = expected_members(
          store, rt->info.job_id, static_cast<uint64_t>(epoch), rt->timeout);
      request.previous = expected.first;
      request.joining = expected.second;
    }
  } catch (const std::exception& e) {
    const LaunchInfo info = rt->info;
    give_up(std::move(rt));
    throw change_error(
        info, request.member, "could not join: " + error_text(e));
  }
  if (epoch < 0) {
    // The job's training ended first: this process stays a world of one.
    elastic::WorldChange none;
    none.rank = -1;
    none.old_size = none.size = 1;
    g_runtime = rt.release();
    return none;
  }
  request.epoch = static_cast<uint64_t>(epoch);
  abandon_world(*rt);
  return form_world(std::move(rt), settings, std::move(request));
}

void elastic::close_to_joiners() {
  using namespace detail;
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (g_runtime == nullptr || g_runtime->info.rank != 0 ||
      !(g_runtime->info.store_hosted || g_runtime->connection))
    return;
  try {
    detail::close_to_joiners(
        elastic_store(*g_runtime, detail::settings()), g_runtime->info.job_id);
  } catch (const std::exception&) {
  }
}

}  // namespace ronde
