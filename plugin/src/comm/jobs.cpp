// Jobs: the call check, stream fencing and failure translation around each
// collective's body. A job runs on its set's communication thread, one at a
// time in submission order (or inline on a blocking caller's thread): see
// docs/thread_model.md, "Threads", for who runs what, and comm/call_check.h
// for the check every rank makes before the body.
//
// Device tensors: at submit the caller's stream gets a "ready" event; the job
// runs its device work on the backend's stream (NCCL's own) or on a side
// stream (staging copies for Gloo), after that event, and ends with a "done"
// event that Handle::wait() orders the waiter's stream after. The caching
// allocator learns of every cross-stream use (record_stream), so no buffer is
// reused while the other stream may still touch it.
#include "comm/jobs.h"

#include "comm/call_check.h"
#include "comm/world.h"
#include "runtime/span.h"

#include <ronde/errors.h>
#include <ronde/timeline.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <unordered_map>

namespace ronde::detail {
namespace {

// Stream order between the caller and the job, for a call on device tensors.
struct Fence {
  c10::Stream caller;  // the submitting thread's current stream
  c10::Event ready;    // recorded on it at submit
};

// The stream a host backend's staging copies run on, one per device.
c10::Stream side_stream(c10::Device device) {
  static std::mutex mutex;
  static std::unordered_map<c10::Device, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it == streams.end()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    it = streams
             .emplace(
                 device,
                 impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true))
             .first;
  }
  return it->second;
}

}  // namespace

Call make_call(
    Group& group,
    OpKind kind,
    const at::Tensor& t,
    const std::string& name,
    bool verify,
    int op,
    int root,
    std::string error) {
  // The backend travels in the descriptor only when it is not the host's.
  std::string via;
  if (t.defined() && !t.is_cpu()) {
    Communicator& comm = *group.comm;
    via = comm.backend_for(t);
    if (via == comm.backend())
      via.clear();
  }
  Descriptor d = describe(kind, t, name, op, root, via, error);
  at::Tensor anchor =
      error.empty() && t.defined() && !t.is_cpu() ? t : at::Tensor();
  return Call{
      kind, &group, name, verify, d, anchor, at::Tensor(), std::nullopt};
}

void fail_call(Communicator& comm, const Call& call, const BackendFailure& e) {
  comm.abort();
  World& w = world("collective");
  const Group& g = *call.group;
  // A shared-memory communicator's ranks are the group's.
  std::vector<int> exited;
  if (std::string(comm.backend()) == "shm") {
    for (int r : e.exited) {
      if (r >= 0 && r < static_cast<int>(g.ranks.size()))
        exited.push_back(g.ranks[r]);
    }
  }
  const World::Suspects suspects =
      w.failed_peers ? w.failed_peers(g.ranks, exited) : World::Suspects{};
  throw CommError(
      e.kind,
      to_string(call.kind),
      call.name,
      w.rank,
      suspects.ranks,
      comm.backend(),
      (g.is_global() ? std::string(e.what())
                     : g.label().substr(4) + ": " + e.what()) +
          suspects.note);
}

Handle submit(
    Call call, Body body, std::vector<at::Tensor> uses, bool blocking) {
  World& w = world(to_string(call.kind));
  Group& group = *call.group;
  if (!call.verify && call.desc.error[0] != '\0') {
    // Without the exchange the other ranks cannot learn of it; fail here.
    TORCH_CHECK(
        false,
        "ronde: ",
        to_string(call.kind),
        group.label(),
        " on rank ",
        w.rank,
        ": ",
        call.desc.error);
  }
  const int64_t submitted_us = timeline_enabled() ? timeline_now_us() : -1;
  std::shared_ptr<const ProfilerContext> profiler = ProfilerContext::capture();
  std::string what = to_string(call.kind);
  if (!call.name.empty())
    what += " '" + call.name + "'";
  std::shared_ptr<Fence> fence;
  if (call.anchor.defined()) {
    const c10::Device device = call.anchor.device();
    c10::impl::VirtualGuardImpl impl(device.type());
    fence = std::make_shared<Fence>(
        Fence{impl.getStream(device), c10::Event(device.type())});
    fence->ready.record(fence->caller);
  }
  // Above the limit a waiting thread leaves the call to the communication
  // thread, which its queueing has woken anyway. Unbounded (the default):
  // no byte count on this path of every call.
  const bool helpable = w.help_bytes == std::numeric_limits<size_t>::max() ||
                        static_cast<size_t>(std::max<int64_t>(
                            0, described_bytes(call.desc))) <= w.help_bytes;
  return group.worker->submit(
      [call = std::move(call),
       body = std::move(body),
       uses = std::move(uses),
       fence,
       what,
       submitted_us,
       profiler = std::move(profiler)](Communicator& comm, HandleState& state) {
        ProfilerContext::Scope profiled(profiler.get());
        // On the job's thread, so that a trace shows it beside the
        // computation it overlaps.
        Span span(profiler_range(call.kind));
        // The exchange first (host memory only): ranks that disagree, on
        // the backend too, learn it before a device backend connects.
        Exchanged ex;
        // While a member is in ronde::join(), every call is checked: the
        // frames tell it what to answer. Decided here, when the job runs,
        // from what the last check showed: the same on every rank.
        if (call.verify || call.group->join.anyone()) {
          guarded(
              comm, call, [&] { ex = check_call(comm, *call.group, call); });
        }
        std::optional<c10::Stream> exec;
        if (fence) {
          guarded(comm, call, [&] { exec = comm.stream_for(call.anchor); });
          if (!exec)
            exec = side_stream(call.anchor.device());
          fence->ready.block(*exec);
        }
        c10::OptionalStreamGuard on_exec(exec);
        body(comm, state, ex, call);
        if (fence) {
          for (const auto& t : uses) {
            if (t.defined() && !t.is_cpu())
              t.record_stream(*exec);
          }
          // Made on the job's stream, handed to the caller's.
          if (state.result.defined() && !state.result.is_cpu())
            state.result.record_stream(fence->caller);
          c10::Event done(exec->device_type());
          done.record(*exec);
          state.device = std::make_shared<DeviceWork>(std::move(done), what);
          comm.watch(call.anchor, state.device);
        }
        if (span.timing() && submitted_us >= 0) {
          span.timeline(
              std::string(to_string(call.kind)) + " " + call.name,
              "collective",
              "\"bytes\":" + std::to_string(described_bytes(call.desc)) +
                  ",\"queued_us\":" +
                  std::to_string(span.start_us() - submitted_us) +
                  ",\"verified\":" + (call.verify ? "true" : "false") +
                  ",\"inline\":" + (ex.payloads.empty() ? "false" : "true") +
                  ",\"fused\":" + (ex.reduced ? "true" : "false"));
        }
      },
      blocking,
      what,
      helpable);
}

Handle submit_task(
    const ProcessSet& set, std::function<void()> task, std::string what) {
  Group& group = group_of(set, "a communication hook");
  std::shared_ptr<const ProfilerContext> profiler = ProfilerContext::capture();
  return group.worker->submit(
      [task = std::move(task), profiler = std::move(profiler)](
          Communicator&, HandleState&) {
        ProfilerContext::Scope profiled(profiler.get());
        task();
      },
      false,
      std::move(what),
      /*helpable=*/false);
}

}  // namespace ronde::detail
