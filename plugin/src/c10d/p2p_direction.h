// One direction of ronde's c10d send and recv between two ranks
// (PointToPoint::Direction, c10d/p2p.h): its message format and matching.
// Included by c10d/p2p.cpp alone, which is why its helpers may stay in an
// unnamed namespace.
#pragma once

#include "c10d/p2p.h"

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "comm/jobs.h"
#include "comm/world.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>

namespace ronde::detail {
namespace {

// A header is kHeaderWords int64: the tag, the type (c10::ScalarType), the
// element count and the byte count, then the bytes of a message that fits
// (kInlineBytes): a small message costs one broadcast, as it did before
// tags were matched.
constexpr int64_t kHeaderWords = 16;
constexpr int64_t kMetaWords = 4;
constexpr int64_t kInlineBytes = (kHeaderWords - kMetaWords) * 8;

// How often the watcher reads the refusals while a send waits.
constexpr auto kWatchPeriod = std::chrono::milliseconds(100);

// The error of a finished handle; null when it succeeded.
std::exception_ptr error_of(const Handle& h) {
  try {
    h.wait();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

template <class... Args>
std::exception_ptr error(const Args&... args) {
  try {
    TORCH_CHECK(false, args...);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// "5 Float (20 bytes)", for messages.
std::string amount(int64_t numel, c10::ScalarType type) {
  return std::to_string(numel) + " " + c10::toString(type) + " (" +
         std::to_string(numel * static_cast<int64_t>(c10::elementSize(type))) +
         " bytes)";
}

}  // namespace

// One direction between two ranks: its set, connected on its own thread.
// Each message is a job on the set's worker that runs its broadcasts on
// the communicator itself: the sender's sends the header and the payload;
// the receiver's reads messages while a receive it posted waits for one
// (see p2p.h). Nothing is submitted from a job or its callbacks, so that a
// worker being drained (the group destroyed, ronde shut down) is never
// handed more.
class PointToPoint::Direction {
 public:
  // `src`, `dst`: group ranks, for errors; `root`: the sender's rank
  // within the pair.
  Direction(
      std::vector<int> pair,
      std::string key,
      int src,
      int dst,
      int root,
      bool sending)
      : src_(src),
        dst_(dst),
        root_(root),
        sending_(sending),
        name_("p2p " + std::to_string(src) + "->" + std::to_string(dst)) {
    thread_ = std::thread([this, pair = std::move(pair), key = std::move(key)] {
      connect(pair, key);
    });
  }
  ~Direction() {
    if (thread_.joinable())
      thread_.join();
    // What was queued on the set runs (and calls back) first.
    drop_member_set(set_);
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      close(
          error(
              "ronde: ",
              sending_ ? "send" : "recv",
              " from rank ",
              src_,
              " to rank ",
              dst_,
              ": the process group was destroyed first"),
          act);
    }
    run(act);
  }

  Handle send(const at::Tensor& tensor, int tag) {
    auto m = std::make_shared<Outgoing>();
    m->proxy = std::make_shared<HandleState>();
    const at::Tensor bytes = tensor.contiguous().reshape({-1}).view(at::kByte);
    const int64_t n = bytes.numel();
    m->header = at::zeros({kHeaderWords}, at::kLong);
    int64_t* w = m->header.data_ptr<int64_t>();
    w[0] = tag;
    w[1] = static_cast<int64_t>(tensor.scalar_type());
    w[2] = tensor.numel();
    w[3] = n;
    if (n > kInlineBytes)
      m->payload = bytes;
    else if (n > 0)
      std::memcpy(w + kMetaWords, bytes.data_ptr(), n);
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failed_) {
        act.fail.emplace_back(m->proxy, failed_);
      } else {
        sends_.push_back(m);
        if (connected_ && queue_.empty())
          transmit(m, act);
        else
          queue_.push_back(m);
      }
    }
    run(act);
    return Handle(m->proxy);
  }

  Handle recv(const at::Tensor& tensor, int tag) {
    Recv r{tag, tensor, std::make_shared<HandleState>()};
    Handle handle(r.proxy);
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = unexpected_.find(tag);
      if (it != unexpected_.end()) {
        Incoming in = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty())
          unexpected_.erase(it);
        in.recv = std::move(r);
        act.deliver.push_back(std::move(in));
      } else if (failed_) {
        act.fail.emplace_back(r.proxy, failed_);
      } else {
        pending_.push_back(std::move(r));
        if (connected_ && !reading_)
          start_reading(act);
      }
    }
    run(act);
    return handle;
  }

  bool waiting() {  // on the sender: whether a send waits
    std::lock_guard<std::mutex> lock(mutex_);
    return !sends_.empty();
  }

  // On the sender: fails the sends that wait with `why` (the receiver
  // refused a receive from any source), and every later one; interrupts
  // the set, whose broadcasts would wait for the timeout. False when no
  // send waited.
  bool refuse(const std::exception_ptr& why) {
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (sends_.empty())
        return false;
      close(why, act);
      refused_ = true;
      interrupt();
    }
    run(act);
    return true;
  }

 private:
  struct Outgoing {
    at::Tensor header;
    at::Tensor payload;  // undefined when the bytes are in the header
    std::shared_ptr<HandleState> proxy;
    bool settled = false;  // the proxy was finished (guarded by mutex_)
  };
  struct Recv {
    int64_t tag = 0;
    at::Tensor tensor;
    std::shared_ptr<HandleState> proxy;  // null: no receive
  };
  // A message read (or being read) on the receiver.
  struct Incoming {
    int64_t tag = 0, type = 0, numel = 0;  // from its header
    at::Tensor bytes;     // where its bytes are (are being written)
    bool direct = false;  // `bytes` is the receive's own tensor
    Recv recv;            // the receive it goes to, if known yet
  };
  // What a change under mutex_ leaves to do once it is released: finishing
  // proxies runs their callbacks, and when_done() on a finished handle
  // runs its callback at once.
  struct Actions {
    std::vector<std::pair<std::shared_ptr<HandleState>, std::exception_ptr>>
        fail;
    std::vector<Incoming> deliver;
    std::vector<std::pair<Handle, std::shared_ptr<Outgoing>>> sent;
    Handle reader;
  };

  // Under mutex_ (connected): queues `fn` on the set's worker.
  template <class F>
  Handle job(F fn, const char* what) {
    Group& g = group_of(set_, what);
    TORCH_CHECK(g.worker != nullptr, "ronde: ", what, ": ronde is shut down");
    return g.worker->submit(
        [fn = std::move(fn), g = &g](Communicator& comm, HandleState&) {
          fn(comm, *g);
        },
        false,
        name_,
        /*helpable=*/false);
  }

  // On the set's worker: one broadcast from the sender, straight on the
  // communicator (no check: both ends know what comes).
  void broadcast(Communicator& comm, Group& g, const at::Tensor& t) const {
    try {
      comm.broadcast(t, root_);
    } catch (const BackendFailure& e) {
      // Interrupted by refuse(): nobody to blame (fail_call() would wait
      // for the peers' failure notices), and nobody waits for this error.
      if (refused_) {
        comm.abort();
        TORCH_CHECK(false, "ronde: ", name_, ": refused by the receiver");
      }
      fail_call(
          comm,
          make_call(g, OpKind::Broadcast, t, name_, false, -1, root_, ""),
          e);
    }
  }

  // Under mutex_ (connected): queues a message's broadcasts.
  void transmit(const std::shared_ptr<Outgoing>& m, Actions& act) {
    try {
      act.sent.emplace_back(
          job(
              [this, m](Communicator& comm, Group& g) {
                broadcast(comm, g, m->header);
                if (m->payload.defined())
                  broadcast(comm, g, m->payload);
              },
              "send"),
          m);
    } catch (...) {
      close(std::current_exception(), act);
    }
  }

  // Under mutex_ (connected, not reading, a receive waiting): queues the
  // job that reads messages until no receive waits.
  void start_reading(Actions& act) {
    try {
      act.reader =
          job([this](Communicator& comm, Group& g) { read(comm, g); }, "recv");
      reading_ = true;
    } catch (...) {
      close(std::current_exception(), act);
    }
  }

  // Under mutex_: nothing more goes through this direction; what waits
  // fails with `e`. Messages kept for later receives stay theirs.
  void close(const std::exception_ptr& e, Actions& act) {
    if (!failed_)
      failed_ = e;
    for (auto& m : sends_) {
      m->settled = true;
      act.fail.emplace_back(m->proxy, e);
    }
    sends_.clear();
    queue_.clear();
    for (Recv& r : pending_)
      act.fail.emplace_back(r.proxy, e);
    pending_.clear();
  }

  // Under mutex_: peers blocked on this rank's part of the set fail now.
  void interrupt() {
    const auto& g = set_.group();
    if (connected_ && g && g->comm)
      g->comm->interrupt();
  }

  // The reader's job, on the set's worker: reads a message, hands it to
  // its receive or keeps it, and goes on while a receive waits.
  void read(Communicator& comm, Group& g) {
    for (;;) {
      const at::Tensor header = at::empty({kHeaderWords}, at::kLong);
      Incoming in;
      Actions act;
      try {
        broadcast(comm, g, header);
        const int64_t* w = header.data_ptr<int64_t>();
        in.tag = w[0];
        in.type = w[1];
        in.numel = w[2];
        const int64_t n = w[3];
        if (n <= kInlineBytes) {
          in.bytes = header.view(at::kByte).narrow(0, kMetaWords * 8, n);
        } else {
          {
            // Straight into the receive's tensor when it can hold them.
            std::lock_guard<std::mutex> lock(mutex_);
            take_receive(in);
            const at::Tensor& t = in.recv.tensor;
            in.direct = in.recv.proxy && fits(in, t) && t.is_contiguous();
          }
          in.bytes = in.direct ? in.recv.tensor.reshape({-1}).view(at::kByte)
                               : at::empty({n}, at::kByte);
          broadcast(comm, g, in.bytes);
        }
      } catch (...) {
        // The set is broken: so is the direction. The worker learns it
        // from the rethrown error.
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (in.recv.proxy)
            act.fail.emplace_back(in.recv.proxy, std::current_exception());
          close(std::current_exception(), act);
          reading_ = false;
        }
        run(act);
        throw;
      }
      bool more = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        take_receive(in);  // one may have come meanwhile
        if (in.recv.proxy)
          act.deliver.push_back(std::move(in));
        else
          unexpected_[in.tag].push_back(std::move(in));
        more = !pending_.empty();
        reading_ = more;
      }
      run(act);
      if (!more)
        return;
    }
  }

  // Under mutex_: `in` gets the first receive waiting for its tag, if any.
  void take_receive(Incoming& in) {
    if (in.recv.proxy)
      return;
    auto it =
        std::find_if(pending_.begin(), pending_.end(), [&](const Recv& r) {
          return r.tag == in.tag;
        });
    if (it != pending_.end()) {
      in.recv = std::move(*it);
      pending_.erase(it);
    }
  }

  static bool fits(const Incoming& in, const at::Tensor& t) {
    return in.type == static_cast<int64_t>(t.scalar_type()) &&
           in.numel == t.numel();
  }

  // Copies the message into its receive's tensor: the receive's outcome.
  std::exception_ptr deliver(const Incoming& in) const {
    const at::Tensor& t = in.recv.tensor;
    if (!fits(in, t)) {
      return error(
          "ronde: recv on rank ",
          dst_,
          " from rank ",
          src_,
          " with tag ",
          in.tag,
          ": the message holds ",
          amount(in.numel, static_cast<c10::ScalarType>(in.type)),
          ", the receive's tensor ",
          amount(t.numel(), t.scalar_type()),
          "; the message is dropped");
    }
    if (in.direct)
      return nullptr;
    try {
      t.copy_(in.bytes.view(t.scalar_type()).view(t.sizes()));
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  // With mutex_ released: what a change left to do.
  void run(Actions& act) {
    for (auto& [proxy, e] : act.fail)
      proxy->finish(e);
    for (const Incoming& in : act.deliver)
      in.recv.proxy->finish(deliver(in));
    for (const auto& [h, m] : act.sent)
      when_done(h, [this, h = h, m = m] { sent(h, m); });
    if (act.reader.state()) {
      // A broken worker fails the job without running it.
      when_done(act.reader, [this, h = act.reader] {
        if (const std::exception_ptr e = error_of(h)) {
          Actions after;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            close(e, after);
            reading_ = false;
          }
          run(after);
        }
      });
    }
  }

  // On the thread that finished a message's job.
  void sent(const Handle& h, const std::shared_ptr<Outgoing>& m) {
    const std::exception_ptr e = error_of(h);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (m->settled)
        return;  // failed already (refused, closed)
      m->settled = true;
      sends_.erase(std::find(sends_.begin(), sends_.end(), m));
    }
    m->proxy->finish(e);
  }

  void connect(const std::vector<int>& pair, const std::string& key) {
    ProcessSet set;
    std::exception_ptr e;
    try {
      set = add_member_set(pair, key);
    } catch (...) {
      e = std::current_exception();
    }
    Actions act;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (e) {
        close(e, act);
      } else {
        set_ = set;
        connected_ = true;
        if (failed_) {
          interrupt();  // refused meanwhile: the peer need not wait
        } else if (sending_) {
          std::deque<std::shared_ptr<Outgoing>> queued;
          queued.swap(queue_);
          for (const auto& m : queued) {
            if (!failed_)
              transmit(m, act);
          }
        } else if (!pending_.empty()) {
          start_reading(act);
        }
      }
    }
    run(act);
  }

  const int src_, dst_;
  const int root_;
  const bool sending_;
  const std::string name_;  // names the set's jobs
  std::thread thread_;
  std::atomic<bool> refused_{false};  // refuse() interrupted the set
  std::mutex mutex_;
  // Guarded by mutex_:
  bool connected_ = false;
  std::exception_ptr failed_;
  ProcessSet set_;
  // The sender's: the messages not finished yet, in order, and those of
  // them posted before the set was connected.
  std::deque<std::shared_ptr<Outgoing>> sends_;
  std::deque<std::shared_ptr<Outgoing>> queue_;
  // The receiver's: the receives without a message yet, in order; whether
  // the reader's job is queued or runs; the messages no receive took yet,
  // by tag.
  std::deque<Recv> pending_;
  bool reading_ = false;
  std::map<int64_t, std::deque<Incoming>> unexpected_;
};

}  // namespace ronde::detail
