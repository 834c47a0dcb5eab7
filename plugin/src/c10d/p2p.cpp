// send and recv of ronde's c10d backend (c10d/p2p.h); one direction's
// matching is in c10d/p2p_direction.h.
#include "c10d/p2p.h"
#include "c10d/p2p_direction.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace ronde::detail {

PointToPoint::~PointToPoint() {
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable())
    watcher_.join();
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
    d = std::make_shared<Direction>(
        pair, key, src, dst, a < b ? 0 : 1, src == rank_);
  }
  return d;
}

Handle PointToPoint::post(
    const at::Tensor& tensor, int src, int dst, int tag, bool sending) {
  const int n = static_cast<int>(global_ranks_.size());
  const int peer = sending ? dst : src;
  const char* what = sending ? "send" : "recv";
  TORCH_CHECK(
      peer >= 0 && peer < n,
      "ronde: ",
      what,
      ": rank ",
      peer,
      " is outside the group's [0, ",
      n,
      ")");
  TORCH_CHECK(
      src != dst, "ronde: ", what, ": rank ", src, " cannot send to itself");
  TORCH_CHECK(
      tensor.is_cpu(),
      "ronde: ",
      what,
      " on rank ",
      rank_,
      ": the tensor is on ",
      tensor.device().str(),
      "; ronde's c10d backend takes CPU tensors");
  if (!sending)
    return direction(src, dst)->recv(tensor, tag);
  Handle handle = direction(src, dst)->send(tensor, tag);
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    posted_ = true;
    if (!watcher_.joinable() && store_)
      watcher_ = std::thread([this] { watch(); });
  }
  watch_cv_.notify_all();
  return handle;
}

void PointToPoint::refuse_any_source() noexcept {
  try {
    if (store_)
      store_->add(refusal_key(rank_), 1);
  } catch (...) {
  }
}

void PointToPoint::watch() {
  std::unique_lock<std::mutex> lock(watch_mutex_);
  while (!stopping_) {
    posted_ = false;
    std::vector<std::pair<int, std::shared_ptr<Direction>>> waiting;
    {
      std::lock_guard<std::mutex> directions_lock(mutex_);
      for (const auto& [ends, d] : directions_) {
        if (ends.first == rank_ && d->waiting())
          waiting.emplace_back(ends.second, d);
      }
    }
    if (waiting.empty()) {
      watch_cv_.wait(lock, [&] { return stopping_ || posted_; });
      continue;
    }
    lock.unlock();
    if (!watch_store_) {
      // A connection of its own: a store client serves one call at a
      // time, and the program may wait on the group's.
      try {
        watch_store_ = store_->clone();
      } catch (...) {
        watch_store_ = store_;
      }
    }
    for (const auto& [dst, d] : waiting) {
      int64_t refusals = 0;
      try {
        refusals = watch_store_->add(refusal_key(dst), 0);
      } catch (...) {
        continue;  // the store is gone: the sends' own timeout remains
      }
      // Each refusal fails the sends waiting when it is seen, or the next
      // one: a send may come just before or just after the refusal.
      if (refusals <= refusals_seen_[dst])
        continue;
      const std::exception_ptr why = error(
          "ronde: send from rank ",
          rank_,
          " to rank ",
          dst,
          ": rank ",
          dst,
          " refused a receive from any source (recv without a source rank, "
          "which ronde does not support), so this send cannot be received; "
          "the sends from rank ",
          rank_,
          " to rank ",
          dst,
          " fail from now on");
      if (d->refuse(why))
        refusals_seen_[dst] = refusals;
    }
    lock.lock();
    watch_cv_.wait_for(lock, kWatchPeriod, [&] { return stopping_; });
  }
}

}  // namespace ronde::detail
