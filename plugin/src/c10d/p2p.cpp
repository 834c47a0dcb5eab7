// send and recv of ronde's c10d backend (c10d/p2p.h).
#include "c10d/p2p.h"

#include "comm/collective_calls.h"
#include "comm/comm_worker.h"
#include "comm/world.h"

#include <c10/util/Exception.h>

#include <deque>
#include <exception>
#include <thread>

namespace ronde::detail {

// One direction between two ranks: its set, connected on its own thread.
class PointToPoint::Direction {
 public:
  Direction(std::vector<int> pair, std::string key, int root)
      : root_(root) {
    thread_ = std::thread([this, pair = std::move(pair), key = std::move(key)] {
      connect(pair, key);
    });
  }
  ~Direction() {
    if (thread_.joinable())
      thread_.join();
    drop_member_set(set_);
  }

  Handle post(const at::Tensor& tensor) {
    auto proxy = std::make_shared<HandleState>();
    std::exception_ptr failed;
    Handle inner;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failed_) {
        failed = failed_;
      } else if (connected_ && queue_.empty()) {
        inner = submit(tensor);
      } else {
        queue_.push_back(Queued{tensor, proxy});
        return Handle(proxy);
      }
    }
    if (failed)
      proxy->finish(failed);
    else
      forward(inner, proxy);
    return Handle(proxy);
  }

 private:
  struct Queued {
    at::Tensor tensor;
    std::shared_ptr<HandleState> proxy;
  };

  // Under mutex_: the broadcast from the sender, queued on the set.
  Handle submit(const at::Tensor& tensor) {
    return broadcast_call(
        tensor, root_, CollectiveOptions().process_set(set_), true, false);
  }

  // Finishes `proxy` as `inner` finishes.
  static void forward(
      const Handle& inner,
      const std::shared_ptr<HandleState>& proxy) {
    when_done(inner, [inner, proxy] {
      std::exception_ptr error;
      try {
        inner.wait();
      } catch (...) {
        error = std::current_exception();
      }
      proxy->finish(error);
    });
  }

  void connect(const std::vector<int>& pair, const std::string& key) {
    ProcessSet set;
    std::exception_ptr error;
    try {
      set = add_member_set(pair, key);
    } catch (...) {
      error = std::current_exception();
    }
    std::deque<Queued> queued;
    std::vector<std::pair<Handle, std::shared_ptr<HandleState>>>
        sent;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued.swap(queue_);
      if (error) {
        failed_ = error;
      } else {
        set_ = set;
        connected_ = true;
        for (Queued& q : queued)
          sent.emplace_back(submit(q.tensor), q.proxy);
      }
    }
    if (error) {
      for (Queued& q : queued)
        q.proxy->finish(error);
    }
    for (auto& [inner, proxy] : sent)
      forward(inner, proxy);
  }

  const int root_;  // the sender's rank within the pair
  std::thread thread_;
  std::mutex mutex_;
  // Guarded by mutex_:
  bool connected_ = false;
  std::exception_ptr failed_;
  ProcessSet set_;
  std::deque<Queued> queue_;
};

PointToPoint::PointToPoint(std::vector<int> global_ranks, std::string group)
    : global_ranks_(std::move(global_ranks)), group_(std::move(group)) {}

PointToPoint::~PointToPoint() {
  std::lock_guard<std::mutex> lock(mutex_);
  directions_.clear();
}

std::shared_ptr<PointToPoint::Direction> PointToPoint::direction(
    int src, int dst) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& d = directions_[{src, dst}];
  if (!d) {
    const int a = global_ranks_[src];
    const int b = global_ranks_[dst];
    std::vector<int> pair{std::min(a, b), std::max(a, b)};
    const std::string key =
        group_ + ".p2p." + std::to_string(src) + "-" + std::to_string(dst);
    d = std::make_shared<Direction>(pair, key, a < b ? 0 : 1);
  }
  return d;
}

Handle PointToPoint::post(
    const at::Tensor& tensor, int src, int dst, bool sending) {
  const int n = static_cast<int>(global_ranks_.size());
  const int peer = sending ? dst : src;
  const char* what = sending ? "send" : "recv";
  TORCH_CHECK(
      peer >= 0 && peer < n,
      "ronde: ", what, ": rank ", peer, " is outside the group's [0, ", n, ")");
  TORCH_CHECK(
      src != dst,
      "ronde: ", what, ": rank ", src, " cannot send to itself");
  return direction(src, dst)->post(tensor);
}

}  // namespace ronde::detail
