// ronde's c10d backend from C++ (ronde/c10d.h): a c10d::ProcessGroup made
// by new_process_group() over a TCPStore of the test's own starts ronde's
// world and runs its collectives there; a subgroup Backend made of two
// ranks runs beside it; ronde's own API shares the world.
#include <ronde/c10d.h>
#include <ronde/ronde.h>

#include "scenario_registry.h"
#include "worker_checks.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace ronde::testing;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

// Asynchronous all-reduces: each work's future completed with the sums,
// whether it is asked for right after the call (its callback then runs at
// once if the work is done, else on this thread inside wait(), or on a
// completion thread, never on the communication thread: the callback here
// waits on a collective of its own, which would hang that thread) or only
// after wait().
void check_async_works(::c10d::ProcessGroup& pg, int rank, int size) {
  ::c10d::AllreduceOptions async;
  async.asyncOp = true;
  const std::thread::id me = std::this_thread::get_id();
  int on_me = 0;  // callbacks run by this thread inside wait()
  bool in_wait = false;
  const int calls = 100;
  for (int i = 0; i < calls; ++i) {
    std::vector<at::Tensor> t{torch::full({256}, float(rank + i))};
    auto work = pg.allreduce(t, async);
    const float want = float(size * i + size * (size - 1) / 2);
    if (i % 2 == 0) {
      auto future = work->getFuture();
      future->addCallback([&](c10::ivalue::Future& f) {
        on_me += in_wait && std::this_thread::get_id() == me;
        std::vector<at::Tensor> inner{torch::ones({4})};
        pg.allreduce(inner, async)->wait();
        CHECK_W(
            torch::equal(inner[0], torch::full({4}, float(size))), inner[0]);
        CHECK_W(
            !f.hasError() &&
                f.value().toTensorVector()[0].eq(want).all().item<bool>(),
            "the future's value in call ",
            i);
      });
      in_wait = true;
      work->wait();
      in_wait = false;
    } else {
      work->wait();
      auto future = work->getFuture();
      CHECK_W(
          future->completed() && !future->hasError(), "call ", i, "'s future");
      CHECK_W(
          future->value().toTensorVector()[0].eq(want).all().item<bool>(),
          "the future's value in call ",
          i);
    }
    CHECK_W(
        t[0].eq(want).all().item<bool>(),
        "call ",
        i,
        ": ",
        t[0][0].item<float>());
  }
  // Without wait() on this thread running the queued all-reduce and
  // completing the work, every callback runs on a completion thread. How
  // often this thread finds it still queued depends on the scheduler:
  // counted over the ranks.
  std::vector<at::Tensor> count{torch::full({1}, float(on_me))};
  pg.allreduce(count)->wait();
  std::cout << "CALLBACKS ON THE WAITER " << on_me << " of " << calls / 2
            << " on rank " << rank << ", " << count[0].item<float>()
            << " on all" << std::endl;
  CHECK_W(
      count[0].item<float>() > 0,
      "no work was completed on the thread waiting on it");
}

}  // namespace

RONDE_SCENARIO(c10d_process_group) {
  const int rank = env_int("RONDE_RANK");
  const int size = env_int("RONDE_SIZE");
  ::c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env_int("RONDE_RENDEZVOUS_PORT"));
  so.isServer = rank == 0;
  so.numWorkers = size;
  so.timeout = std::chrono::seconds(30);
  auto store = c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", so);
  auto pg = ronde::c10d::new_process_group(
      store, rank, size, std::chrono::seconds(30));
  CHECK_W(ronde::is_initialized(), "the group did not start ronde");
  CHECK_W(ronde::rank() == rank && ronde::size() == size, "ronde's world");
  CHECK_W(ronde::host_backend() == "shm", ronde::host_backend());

  std::vector<at::Tensor> t{torch::full({5}, float(rank + 1))};
  pg->allreduce(t)->wait();
  const float total = size * (size + 1) / 2.0f;
  CHECK_W(torch::equal(t[0], torch::full({5}, total)), t[0]);

  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < size; ++r)
    outs[0].push_back(torch::zeros({2}));
  std::vector<at::Tensor> in{torch::full({2}, float(rank))};
  auto work = pg->allgather(outs, in);
  work->getFuture()->wait();
  for (int r = 0; r < size; ++r)
    CHECK_W(torch::equal(outs[0][r], torch::full({2}, float(r))), outs[0][r]);

  std::vector<at::Tensor> b{torch::full({3}, float(rank))};
  ::c10d::BroadcastOptions bo;
  bo.rootRank = size - 1;
  pg->broadcast(b, bo)->wait();
  CHECK_W(torch::equal(b[0], torch::full({3}, float(size - 1))), b[0]);

  check_async_works(*pg, rank, size);

  // A subgroup of ranks 0 and 1, created by its members only.
  if (rank < 2) {
    ronde::c10d::BackendOptions o;
    o.store = store;
    o.rank = rank;
    o.size = 2;
    o.global_ranks = {0, 1};
    o.group_name = "pair";
    auto sub = c10::make_intrusive<ronde::c10d::Backend>(o);
    std::vector<at::Tensor> s{torch::full({2}, float(rank + 5))};
    sub->allreduce(s, ::c10d::AllreduceOptions())->wait();
    CHECK_W(torch::equal(s[0], torch::full({2}, 11.0f)), s[0]);
    CHECK_W(sub->process_set().size() == 2, "the pair's set");
  }
  // ronde's own API on the same world, then the group again.
  at::Tensor mine = ronde::allreduce(
      torch::ones({2}), ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(torch::equal(mine, torch::full({2}, float(size))), mine);
  pg->barrier()->wait();
  ronde::shutdown();
  return scenario_exit_code();
}
