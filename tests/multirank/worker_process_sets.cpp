// The process-set scenario: every collective on two halves of the job at
// once, overlapping sets, removal, and the errors of creating sets that
// differ between ranks.
#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/process_set.h>
#include <ronde/runtime.h>

#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_reference.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace ronde::testing;

// Process sets: the job in two halves (sets of one rank at 2 and 3 ranks),
// each running every collective at once, against references computed with
// the set's own numbering; an overlapping set after them; the errors.
RONDE_SCENARIO(process_sets) {
  // Ranks 0..n/2-1, given to init() before it knows n: from the env.
  const int n_env = std::atoi(std::getenv("RONDE_SIZE"));
  std::vector<int> low, high;
  for (int r = 0; r < n_env; ++r)
    (r < n_env / 2 ? low : high).push_back(r);
  ronde::ProcessSet first(low);
  CHECK_W(first.id() == -1, "a set before init() has an id");
  ronde::init(ronde::InitOptions().process_sets({first}));
  const int n = ronde::size(), me = ronde::rank();
  CHECK_W(first.id() == 1, "init() gave the first set id ", first.id());
  ronde::ProcessSet second = ronde::add_process_set(high);
  CHECK_W(second.id() == 2, "second set id ", second.id());
  CHECK_W(ronde::process_sets().size() == 3, "three sets");
  CHECK_W(ronde::process_sets()[0].is_global(), "global set first");
  const bool in_first = me < n / 2;
  ronde::ProcessSet& mine = in_first ? first : second;
  ronde::ProcessSet& other = in_first ? second : first;
  CHECK_W(mine.included() && !other.included(), "included()");
  CHECK_W(
      mine.rank() == (in_first ? me : me - n / 2) &&
          mine.size() == static_cast<int>((in_first ? low : high).size()),
      "set rank ",
      mine.rank(),
      " size ",
      mine.size());
  CHECK_W(mine.ranks() == (in_first ? low : high), "ranks()");
  // Both halves at once, each in its own order.
  check_allreduce(mine);
  check_allgather(mine);
  check_broadcast(mine);
  check_alltoall(mine);
  check_reducescatter(mine);
  check_into(mine);
  check_async(mine);
  // The job's own collectives meanwhile still span every rank.
  at::Tensor total = ronde::allreduce(
      at::full({1}, static_cast<double>(me), at::kDouble),
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(total.item<double>() == n * (n - 1) / 2.0, "global sum");

  // An async collective on one set, a global one, then the wait: sets run
  // on workers of their own.
  at::Tensor big = at::full({1 << 16}, 1.0f);
  ronde::Handle h = ronde::allreduce_async(
      big,
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).process_set(mine));
  ronde::barrier();
  CHECK_W(
      at::equal(h.result(), at::full({1 << 16}, float(mine.size()))),
      "async on a set across a global barrier");

  // A rank outside a set calling on it: an error here, nowhere else.
  expect_error(
      [&] {
        ronde::allreduce(
            at::ones({2}), ronde::AllreduceOptions().process_set(other));
      },
      {"allreduce on process set " + std::to_string(other.id()),
       "called on rank " + std::to_string(me),
       "not in the set"});

  // A mismatch within a set fails on its members, naming the set.
  if (mine.size() > 1) {
    expect_error(
        [&] {
          const int64_t cols = mine.rank() == mine.size() - 1 ? 3 : 2;
          ronde::allreduce(
              at::ones({cols}),
              ronde::AllreduceOptions().name("odd").process_set(mine));
        },
        {"disagree", "'odd'", "process set " + std::to_string(mine.id())});
  }

  // Overlapping sets, one after the other: every rank but 0, then all.
  std::vector<int> tail;
  for (int r = 1; r < n; ++r)
    tail.push_back(r);
  ronde::ProcessSet rest = ronde::add_process_set(tail);
  if (rest.included()) {
    check_allreduce(rest);
    check_broadcast(rest);
  }
  std::vector<int> backwards;
  for (int r = n - 1; r >= 0; --r)
    backwards.push_back(r);
  ronde::ProcessSet all = ronde::add_process_set(ronde::ProcessSet(backwards));
  check_allgather(all);
  CHECK_W(all.ranks()[0] == 0 && all.size() == n, "ranks sorted");
  ronde::remove_process_set(rest);
  expect_error([&] { ronde::barrier(rest); }, {"was removed"});
  CHECK_W(ronde::process_sets().size() == 4, "after one removal");

  // Creations that differ between ranks fail on every rank, naming each
  // rank's request; the job goes on.
  expect_error(
      [&] {
        ronde::add_process_set(
            me == 0 ? std::vector<int>{0} : std::vector<int>{0, 1});
      },
      {"add_process_set",
       "did not all make the same call",
       "rank 0 [0]",
       "rank 1 [0, 1]"});
  expect_error(
      [&] {
        ronde::add_process_set({0, n});
      },
      {"rank " + std::to_string(n) + " is outside [0, " + std::to_string(n) +
       ")"});
  expect_error([&] { ronde::add_process_set(first); }, {"created already"});
  expect_error(
      [&] { ronde::remove_process_set(ronde::global_process_set()); },
      {"cannot be removed"});
  // Ids are never reused.
  ronde::ProcessSet again = ronde::add_process_set(low);
  CHECK_W(again.id() == 5, "ids count up: ", again.id());
  if (again.included())
    check_reducescatter(again);
  ronde::shutdown();
  // A set of a finished job is not part of the next one.
  CHECK_W(first.id() == -1, "a set outlived shutdown()");
  return ronde::testing::scenario_exit_code();
}

}  // namespace
