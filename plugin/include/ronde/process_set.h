// Process sets: subsets of the job's ranks that run collectives among
// themselves, as Horovod's hvd.ProcessSet and torch.distributed's new_group.
// Each set has its own communicator (shared memory when its ranks share a
// host, Gloo otherwise, hierarchical across hosts, NCCL for CUDA tensors),
// its own worker thread and so its own collective order, and its own rank
// and size. The job itself is the global process set, id 0.
//
//   auto even = ronde::add_process_set({0, 2});   // every rank calls it
//   if (even.included())
//     ronde::allreduce_(t, ronde::AllreduceOptions().process_set(even));
//
// Within a set, ranks are numbered 0..size()-1 in the order of their job
// ranks: broadcast roots, alltoall splits and allgather order use that
// numbering. Creating and removing sets are collectives of the whole job:
// every rank calls them with the same ranks, in the same order relative to
// the job's other collectives.
#pragma once

#include <memory>
#include <vector>

namespace ronde {

namespace detail {
struct Group;
}

class ProcessSet {
 public:
  // The global set: every rank of the job. Usable before init().
  ProcessSet();
  // A set of these job ranks (any order, no duplicates), not yet created:
  // hand it to InitOptions::process_sets or add_process_set().
  explicit ProcessSet(std::vector<int> ranks);

  // 0 for the global set; the id add_process_set() gave it; -1 while the
  // set is not (or no longer) part of the job.
  int id() const;
  // The job ranks in the set, ascending.
  std::vector<int> ranks() const;
  // Whether this rank belongs to the set. Needs init().
  bool included() const;
  // This rank's rank within the set and the set's size. Throw c10::Error
  // on a rank outside the set, or before the set is created.
  int rank() const;
  int size() const;
  bool is_global() const {
    return group_ == nullptr;
  }

  // The same set (same id, or both global).
  bool operator==(const ProcessSet& other) const;
  bool operator!=(const ProcessSet& other) const {
    return !(*this == other);
  }

  // The set's state; null for the global set (resolved when used, so that a
  // default-constructed option means "the job").
  const std::shared_ptr<detail::Group>& group() const {
    return group_;
  }
  static ProcessSet from_group(std::shared_ptr<detail::Group> group);

 private:
  std::shared_ptr<detail::Group> group_;
};

// The global set (id 0).
ProcessSet global_process_set();

// Creates a set of these job ranks: a collective of the whole job, which
// every rank calls with the same ranks (else every rank fails with a
// c10::Error naming what each asked for). Ranks in the set connect its
// communicator; the others get a handle with included() false. Returns the
// set, with its id (ids count up from 1 and are never reused).
ProcessSet add_process_set(const std::vector<int>& ranks);
ProcessSet add_process_set(const ProcessSet& set);

// Removes a set: a collective of the whole job, once every rank is done
// with the set (its queued collectives are waited for first). Handles to it
// then fail when used. The global set cannot be removed.
void remove_process_set(const ProcessSet& set);

// Every set the job has now, the global set first, then by id.
std::vector<ProcessSet> process_sets();

}  // namespace ronde
