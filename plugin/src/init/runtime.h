// What init.cpp and elastic.cpp share: the state init() builds besides the
// World, and the steps that connect a world, used by init() and again at
// each elastic change of world.
#pragma once

#include "comm/world.h"
#include "runtime/auth.h"
#include "runtime/launch_env.h"
#include "runtime/settings.h"
#include "runtime/stall_inspector.h"

#include <ronde/runtime.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace ronde::detail {

// What init() found and built besides the World: where this process sits in
// the job, the store, and the inspector watching the World's worker.
struct Runtime {
  LaunchInfo info;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // What init() was given, for the next epoch's connect().
  InitOptions options;
  // This epoch's view of the store (signed when the job is authenticated);
  // null in a job of one rank.
  c10::intrusive_ptr<c10d::Store> store;
  // The connection under it, kept across epochs: on rank 0 of a job whose
  // launcher hosts no store, the store's server itself.
  c10::intrusive_ptr<c10d::Store> connection;
  // Rank 0 hosts the store in its process (no launcher's store, none given
  // by a torch.distributed process group): shutdown() leaves it in step.
  bool rank0_hosts_store = false;
  // The job key (from the job secret), once read; the elastic keys'
  // view of the store, signed with a key derived from it.
  std::optional<Key32> job_key;
  c10::intrusive_ptr<c10d::Store> elastic_store;
  // This process's rank at launch (its member id for life), and the member
  // ids of this epoch's ranks, by rank.
  int member = 0;
  std::vector<int> members;
  // Started into a running elastic job, and not yet admitted to it.
  bool joining = false;
  // Watches for collectives that a rank never submits; null for one rank.
  std::unique_ptr<StallInspector> inspector;
};

// Guards init(), shutdown() and changes of world against each other.
extern std::mutex g_init_mutex;
extern Runtime* g_runtime;

// Meets the other ranks of rt.info's world and connects it.
std::unique_ptr<World> connect(
    Runtime& rt, const InitOptions& options, const Settings& settings);
// After connect(): numbers the world, starts the stall inspector on its
// global set's worker, and installs it.
void bring_up(Runtime& rt, const Settings& settings, std::unique_ptr<World> w);
// The job secret file: InitOptions' when given, else the setting's.
std::string job_secret_file(const Runtime& rt, const Settings& settings);
// A barrier of the world's global set, waited on; throws what it throws.
void barrier(World& w, const char* what);
// A torch.distributed process group joins ronde's world through it
// (plugin/src/c10d/). When ronde is not initialised, initialises it as
// init() would, but as `rank` of `size` meeting the others in `store` (the
// group's), with `timeout` for the rendezvous and every collective, and
// `addr`:`port` as the rendezvous address (empty when the store has none):
// returns true. When it is, checks that its world is this one (same rank and
// size; c10::Error else) and returns false.
bool attach_to_store(
    c10::intrusive_ptr<c10d::Store> store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& addr,
    int port);
// The stores go, and the settings and the timeline with them: what is
// left of a Runtime once its World is gone.
void release(Runtime& rt);

}  // namespace ronde::detail
