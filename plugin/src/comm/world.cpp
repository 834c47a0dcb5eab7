// The live World. Read without a lock on every collective: init() and
// shutdown() must not race with collectives (documented in runtime.h).
#include "comm/world.h"

#include <c10/util/Exception.h>

namespace ronde::detail {
namespace {

// Deliberately never destroyed at exit: a job that forgot shutdown() must not
// tear down sockets and threads during static destruction.
World* g_world = nullptr;

}  // namespace

World::~World() {
  worker.reset();  // drains what is queued while `comm` still exists
  comm.reset();
}

World& world(const char* caller) {
  TORCH_CHECK(
      g_world != nullptr, "ronde::", caller, "() needs ronde::init() first");
  return *g_world;
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
