// The job as comm/ sees it: its process sets (the global one and those the
// program added), each with the communicator and the worker that runs its
// collectives, and what a failed collective needs to name its suspects.
// init() builds it and installs it; shutdown() takes it down. comm/ never
// reaches into the runtime: what it needs from there is handed in here.
#pragma once

#include "comm/call_check.h"
#include "comm/comm_worker.h"
#include "comm/communicator.h"

#include <ronde/process_set.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ronde::detail {

// One process set. Its fields change only in init(), add_process_set(),
// remove_process_set() and shutdown(), which must not race with
// collectives on the set (documented in process_set.h).
struct Group {
  explicit Group(std::vector<int> ranks) : ranks(std::move(ranks)) {}
  ~Group();

  std::vector<int> ranks;  // job ranks, ascending
  int id = -1;             // -1: not created, or removed
  uint64_t epoch = 0;      // the init() it was created under
  int rank = -1;           // this rank within the set; -1: not a member
  int size = 0;
  // Null on ranks outside the set, and once removed.
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<CommWorker> worker;  // runs on `comm`: destroyed first
  // What the call check (comm/call_check.h) keeps between the set's calls.
  VerifiedCalls verified_calls;
  JoinState join;

  bool is_global() const {
    return id == 0;
  }
  // " on process set 2 [0, 2]" for messages; empty for the global set.
  std::string label() const;
};

struct World {
  int rank = 0;
  int size = 1;
  uint64_t epoch = 0;  // counts init() calls of this process
  std::shared_ptr<Group> global;
  // How the global communicator was connected: sets connect alike, with
  // the same config and a group of their own under the global one.
  CommConfig config;
  CommGroup group;
  bool blocking_wait = false;
  // The largest collective (bytes per rank) a thread waiting on it runs
  // itself while it is queued (RONDE_HELP_BYTES, CommWorker::help); the
  // maximum: any.
  size_t help_bytes = std::numeric_limits<size_t>::max();
  // After a collective failed here: the peers among these job ranks that
  // did not report the failure themselves in time (the runtime's failure
  // notices in the store), and what the failure's message must add (the
  // store could not be asked either). Null in a job of one rank: nobody
  // to blame.
  struct Suspects {
    std::vector<int> ranks;
    std::string note;  // empty, or "; " and a sentence
  };
  std::function<Suspects(
      const std::vector<int>& among, const std::vector<int>& exited)>
      failed_peers;

  std::mutex sets_mutex;
  std::map<int, std::shared_ptr<Group>> sets;  // guarded; the added ones
  int next_set_id = 1;                         // guarded
  // How many member sets were made under each key (add_member_set):
  // the members count alike, so a key used again gets keys of its own.
  std::map<std::string, int> member_set_keys;  // guarded

  ~World();
};

// "[0, 2, 3]", for messages.
std::string rank_list(const std::vector<int>& ranks);

// The live World; throws c10::Error naming `caller` before init().
World& world(const char* caller);
// The group a collective on `set` runs in: the global one for the default
// set. Throws c10::Error naming `caller` for a set that is not part of the
// job, and for a rank outside the set.
Group& group_of(const ProcessSet& set, const char* caller);
// init() installs the World it built; shutdown() removes it and returns it,
// to be destroyed after the barrier.
void install_world(std::unique_ptr<World> w);
std::unique_ptr<World> remove_world();
// At shutdown(): stops the workers of every added set once they ran what
// was queued (before the last barrier), then closes their communicators
// and marks them removed (after it).
void stop_added_sets(World& w);
void close_added_sets(World& w);
// A set that only its members create, among themselves: a
// torch.distributed subgroup, whose backend torch creates on its members
// alone. `key` names it in the store: every member passes the same, and no
// other set of the job has it. Registered as an added set (shutdown()
// closes it), with an id of this process's own, which other ranks may
// number otherwise. Throws CommError of kind Rendezvous when the members do
// not all come within the timeout, and c10::Error for bad ranks or a rank
// outside them.
ProcessSet add_member_set(
    const std::vector<int>& ranks, const std::string& key);
// Drops a member set here without meeting the other members: what is queued
// on it runs first. Nothing for a set already gone.
void drop_member_set(const ProcessSet& set);
// An elastic change of world: interrupts every set's communicator (the
// global one too), so that whatever is queued or blocked on a dead peer
// fails at once and the workers can be stopped without waiting.
void interrupt_all_sets(World& w);

}  // namespace ronde::detail
