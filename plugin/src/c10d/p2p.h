// send and recv of ronde's c10d backend. Each direction between two ranks
// of a group is a process set of those two ranks, which the pair connects
// among themselves on first use, and a message is a broadcast on it from
// the sender: messages from one rank to another arrive in the order sent,
// and tags are not matched. A set is connected on a thread of its own, so
// that a ring of first sends (each rank sending to the next, and only then
// receiving) cannot wait on itself; what is posted meanwhile is queued and
// submitted in order once it is connected.
#pragma once

#include <ronde/collectives.h>
#include <ronde/process_set.h>

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ronde::detail {

class PointToPoint {
 public:
  // `global_ranks`: the group's ranks in ronde's world, by group rank;
  // `group`: the group's name, the same on every member.
  PointToPoint(std::vector<int> global_ranks, std::string group);
  // Waits for the connections still being made.
  ~PointToPoint();

  // Queues the message of `tensor` from group rank `src` to `dst` (this
  // rank is one of them: the sender when `sending`). The handle finishes
  // when it was sent or received; a failed connection fails it.
  Handle post(const at::Tensor& tensor, int src, int dst, bool sending);

 private:
  class Direction;
  std::shared_ptr<Direction> direction(int src, int dst);

  const std::vector<int> global_ranks_;
  const std::string group_;
  std::mutex mutex_;
  std::map<std::pair<int, int>, std::shared_ptr<Direction>> directions_;
};

}  // namespace ronde::detail
