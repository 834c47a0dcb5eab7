// send and recv of ronde's c10d backend. Each direction between two ranks
// of a group is a process set of those two ranks, which the pair connects
// among themselves on first use. A message is two broadcasts on it from the
// sender: a header (tag, type, element count; the bytes themselves when
// they fit in it) and then, unless they did, the payload as bytes. Tags are
// matched as gloo and MPI match them: messages of one tag arrive in the
// order sent, and a receive takes the first message of its tag, whatever
// was sent before it under other tags. The receiving side reads a header
// only while a receive it posted has no message yet (a broadcast waiting on
// a silent peer would time out and break the set); a message nobody waits
// for yet is kept, by tag, for the receives that come later (MPI's
// unexpected messages). A message whose type or element count differs from
// its receive's fails that receive; it is consumed all the same, so the
// direction stays in step.
// A set is connected on a thread of its own, so that a ring of first sends
// (each rank sending to the next, and only then receiving) cannot wait on
// itself; what is posted meanwhile is queued and submitted in order once it
// is connected.
// A receive from any source is refused (a direction knows its sender);
// the refusal is published in the group's store, and a watcher thread
// fails the sends to that rank that wait meanwhile, or the next one, within
// about 0.1 s: without it they would wait for the group's timeout.
#pragma once

#include <ronde/collectives.h>
#include <ronde/process_set.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ronde::detail {

class PointToPoint {
 public:
  // `global_ranks`: the group's ranks in ronde's world, by group rank;
  // `group`: the group's name, the same on every member; `rank`: this
  // rank in the group; `store`: the group's store (torch's, prefixed for
  // the group), where a refused any-source receive is published.
  PointToPoint(
      std::vector<int> global_ranks,
      std::string group,
      int rank,
      c10::intrusive_ptr<::c10d::Store> store)
      : global_ranks_(std::move(global_ranks)),
        group_(std::move(group)),
        rank_(rank),
        store_(std::move(store)) {}
  // Stops the watcher; waits for the connections still being made.
  ~PointToPoint();

  // Queues the message of `tensor` (a CPU tensor) from group rank `src` to
  // `dst` under `tag` (this rank is one of them: the sender when
  // `sending`). The handle finishes when it was sent or received; a failed
  // connection fails it.
  Handle post(
      const at::Tensor& tensor, int src, int dst, int tag, bool sending);

  // Publishes that this rank refused a receive from any source, for the
  // ranks whose sends to it wait (see above). Never throws: the caller's
  // own error is what matters.
  void refuse_any_source() noexcept;

 private:
  class Direction;
  std::shared_ptr<Direction> direction(int src, int dst);
  // The key of rank `dst`'s refusals in the store.
  std::string refusal_key(int dst) const {
    return "ronde.p2p." + group_ + ".any_source_refused." + std::to_string(dst);
  }
  // The watcher thread: while a send waits, polls the refusals of its
  // destination.
  void watch();

  const std::vector<int> global_ranks_;
  const std::string group_;
  const int rank_;
  const c10::intrusive_ptr<::c10d::Store> store_;
  std::mutex mutex_;
  std::map<std::pair<int, int>, std::shared_ptr<Direction>> directions_;

  // The watcher's, guarded by watch_mutex_ (taken before mutex_):
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool posted_ = false;  // a send was posted since the watcher last looked
  bool stopping_ = false;
  std::thread watcher_;  // started by the first send
  // Touched by the watcher only: its own connection to the store, and
  // how many refusals of each destination it has acted on.
  c10::intrusive_ptr<::c10d::Store> watch_store_;
  std::map<int, int64_t> refusals_seen_;
};

}  // namespace ronde::detail
