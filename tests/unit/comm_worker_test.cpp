// The communication worker on its own, over a one-rank communicator that
// its jobs never touch: what a waiting thread runs (CommWorker::help), and
// that the worker thread is woken for what the waiter leaves.
#include "comm/comm_worker.h"
#include "comm/communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

namespace {

using ronde::detail::Communicator;
using ronde::detail::CommWorker;
using ronde::detail::HandleState;

// Runs `fn` and fails the test binary at once if it has not returned
// within the limit: a hang is what the test looks for.
template <typename F>
void within_seconds(int seconds, F fn) {
  auto done = std::async(std::launch::async, fn);
  if (done.wait_for(std::chrono::seconds(seconds)) !=
      std::future_status::ready) {
    ADD_FAILURE() << "still waiting after " << seconds << " s";
    std::_Exit(1);  // the hung thread cannot be joined
  }
  done.get();
}

// A waiter runs the queued collectives up to its own while the worker
// thread sleeps; a task (helpable = false) ends that, and the worker
// thread, which found the waiter busy and slept again, must be woken for
// the task and what follows it, or the wait never returns.
TEST(CommWorker, AWaiterRunsQueuedJobsAndWakesTheWorkerAtATask) {
  auto comm = ronde::detail::make_self_communicator();
  CommWorker worker(*comm, false);
  std::atomic<int> on_waiter{0}, tasks_on_waiter{0}, ran{0};
  int rounds = 0;
  within_seconds(60, [&] {
    // std::async's thread is the waiter here.
    const std::thread::id me = std::this_thread::get_id();
    // 200 rounds, and more while no job has run on the waiter yet: whether
    // the waiter finds its jobs still queued is up to the scheduler (on a
    // loaded machine the woken worker thread can win every round of 200).
    for (; rounds < 200 || (on_waiter.load() == 0 && rounds < 20000);
         ++rounds) {
      auto slow = [&](Communicator&, HandleState&) {
        // Long enough that the worker thread, woken by the push, finds
        // the waiter running it.
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        on_waiter += std::this_thread::get_id() == me;
        ++ran;
      };
      auto task = [&](Communicator&, HandleState&) {
        tasks_on_waiter += std::this_thread::get_id() == me;
        ++ran;
      };
      auto last = [&](Communicator&, HandleState&) { ++ran; };
      ronde::Handle first = worker.submit(std::move(slow));
      ronde::Handle middle =
          worker.submit(std::move(task), false, "task", /*helpable=*/false);
      ronde::Handle mine = worker.submit(std::move(last));
      mine.wait();
      middle.wait();
      first.wait();
    }
  });
  EXPECT_EQ(ran.load(), 3 * rounds);
  EXPECT_GT(on_waiter.load(), 0) << "no queued job ran on the waiting thread";
  EXPECT_EQ(tasks_on_waiter.load(), 0) << "a task ran on the waiting thread";
}

// A waiter whose job the worker thread already runs waits for it, and
// the worker's destructor drains what is queued.
TEST(CommWorker, QueuedJobsRunInOrderWhoeverRunsThem) {
  auto comm = ronde::detail::make_self_communicator();
  std::vector<int> order;
  {
    CommWorker worker(*comm, false);
    std::vector<ronde::Handle> handles;
    for (int i = 0; i < 100; ++i) {
      handles.push_back(worker.submit(
          [&order, i](Communicator&, HandleState&) { order.push_back(i); },
          false,
          "job",
          /*helpable=*/i % 3 != 0));
      if (i % 7 == 0)
        handles.back().wait();
    }
    handles[50].wait();
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(order[i], i);
}

}  // namespace
