// The live World. Read without a lock on every collective: init() and
// shutdown() must not race with collectives (documented in runtime.h).
#include "comm/world.h"

#include "comm/collective_calls.h"

#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <sstream>

namespace ronde::detail {
namespace {

// Deliberately never destroyed at exit: a job that forgot shutdown() must not
// tear down sockets and threads during static destruction.
World* g_world = nullptr;

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

Group::~Group() {
  worker.reset();  // drains what is queued while `comm` still exists
  comm.reset();
}

std::string Group::label() const {
  if (is_global())
    return "";
  return " on process set " + std::to_string(id) + " " + rank_list(ranks);
}

World::~World() {
  global.reset();
}

World& world(const char* caller) {
  TORCH_CHECK(
      g_world != nullptr, "ronde::", caller, "() needs ronde::init() first");
  return *g_world;
}

Group& group_of(const ProcessSet& set, const char* caller) {
  World& w = world(caller);
  if (set.is_global())
    return *w.global;
  Group& g = *set.group();
  TORCH_CHECK(
      g.id > 0 && g.epoch == w.epoch,
      "ronde: ",
      caller,
      " on rank ",
      w.rank,
      ": process set ",
      rank_list(g.ranks),
      g.id < 0 && g.epoch == w.epoch && g.epoch != 0
          ? " was removed"
          : " is not part of the job",
      " (create it on every rank with ronde::add_process_set() or "
      "InitOptions::process_sets)");
  TORCH_CHECK(
      g.rank >= 0,
      "ronde: ",
      caller,
      g.label(),
      " called on rank ",
      w.rank,
      ", which is not in the set");
  return g;
}

at::Tensor bucket_zeros(
    const ProcessSet& set, int64_t numel, const at::TensorOptions& options) {
  Group& g = group_of(set, "bucket_zeros");
  if (g.comm) {
    if (std::optional<at::Tensor> t = g.comm->shared_zeros(numel, options))
      return *t;
  }
  return at::zeros({numel}, options);
}

void install_world(std::unique_ptr<World> w) {
  TORCH_INTERNAL_ASSERT(g_world == nullptr, "a second World installed");
  g_world = w.release();
}

std::unique_ptr<World> remove_world() {
  std::unique_ptr<World> w(g_world);
  g_world = nullptr;
  return w;
}

}  // namespace ronde::detail
