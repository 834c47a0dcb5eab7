// Jobs: descriptor exchange, stream fencing and failure translation around
// each collective's body.
//
// Device tensors: at submit the caller's stream gets a "ready" event; the job
// runs its device work on the backend's stream (NCCL's own) or on a side
// stream (staging copies for Gloo), after that event, and ends with a "done"
// event that Handle::wait() orders the waiter's stream after. The caching
// allocator learns of every cross-stream use (record_stream), so no buffer is
// reused while the other stream may still touch it.
#include "comm/jobs.h"

#include "comm/world.h"
#include "runtime/span.h"

#include <ronde/errors.h>
#include <ronde/timeline.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace ronde::detail {
namespace {

// The descriptors of ranks in ronde::join() become the call the others
// made (the first of them, which check_descriptors() then holds the rest
// to), with no complaint and, where ranks may differ there, dim 0 zero:
// every body then runs on a joined rank as on the others, with an input
// that changes nothing. Fails alike on every rank for a call that a joined
// rank cannot answer.
void stand_in_for_joined(
    std::vector<Descriptor>& all, const std::vector<char>& joined) {
  int active = -1;
  for (size_t r = 0; r < all.size() && active < 0; ++r) {
    if (!joined[r])
      active = static_cast<int>(r);
  }
  const Descriptor& call = all[active];
  const auto kind = static_cast<OpKind>(call.kind);
  // Bounded: a peer's bytes need not end in a terminator.
  const std::string name =
      call.name[0]
          ? " '" +
                std::string(call.name, strnlen(call.name, sizeof(call.name))) +
                "'"
          : std::string();
  const std::string backend(
      call.backend, strnlen(call.backend, sizeof(call.backend)));
  TORCH_CHECK(
      kind != OpKind::Broadcast || call.root < 0 ||
          call.root >= static_cast<int>(all.size()) || !joined[call.root],
      "ronde: broadcast",
      name,
      " from rank ",
      call.root,
      ", which is in ronde::join(): a joined rank has nothing to send");
  TORCH_CHECK(
      call.backend[0] == '\0',
      "ronde: ",
      to_string(kind),
      name,
      " on ",
      backend,
      " while a rank is in ronde::join(): joined ranks answer host "
      "collectives only");
  for (size_t r = 0; r < all.size(); ++r) {
    if (!joined[r])
      continue;
    all[r] = call;
    all[r].error[0] = '\0';
    if (ragged(kind) && all[r].ndim > 0)
      all[r].dims[0] = 0;
  }
}

// Exchanges the full descriptors and throws the same c10::Error on every
// rank if they disagree or any rank reported a problem with its input.
std::vector<Descriptor> exchange_descriptors(
    Communicator& comm,
    const Group& g,
    const Descriptor& mine,
    const std::vector<char>& joined) {
  const int n = comm.size();
  std::vector<Descriptor> all(n);
  auto in = at::from_blob(
      const_cast<Descriptor*>(&mine), {sizeof(Descriptor)}, at::kByte);
  auto out = at::from_blob(
      all.data(), {static_cast<int64_t>(n * sizeof(Descriptor))}, at::kByte);
  comm.allgather(in, out, std::vector<size_t>(n, sizeof(Descriptor)));
  if (!joined.empty())
    stand_in_for_joined(all, joined);
  if (g.is_global()) {
    check_descriptors(all, comm.rank());
    return all;
  }
  try {
    check_descriptors(all, comm.rank());
  } catch (const c10::Error& e) {
    TORCH_CHECK(
        false,
        e.msg(),
        " [",
        g.label().substr(1),
        "; ranks there are numbered within the set]");
  }
  return all;
}

// The check of a call in (usually) one exchange: every rank sends a frame of
// the same size (descriptor.h) with its descriptor's fingerprint and, when
// it fits, its payload. Every rank then sees the same frames and takes the
// same decision: when every fingerprint is equal and was verified in full
// before, the call is checked; otherwise (a first call, a mismatch, a
// complaint) the full descriptors follow and check_descriptors() throws or
// passes on every rank alike, which verifies the fingerprint for next time.
// A mismatch thus still fails on every rank; a call seen before costs one
// exchange, which carries a small collective's data too.
Exchanged check_call(Communicator& comm, Group& g, const Call& call) {
  const int n = comm.size();
  // Over shared memory a round trip costs about what copying the frames
  // does (measured: 4 KiB inline was slower than a header and the
  // all-reduce): frames carry only their header there. The host backend is
  // the job's, so every rank sizes frames alike.
  const bool carry = std::strcmp(comm.backend(), "shm") != 0;
  const size_t cap = carry ? inline_capacity(n) : 0;
  const size_t frame = sizeof(FrameHeader) + cap;
  const uint64_t fp = fingerprint(call.desc);
  FrameHeader head;
  head.fingerprint = fp;
  head.dim0 = call.desc.ndim > 0 ? call.desc.dims[0] : 0;
  if (call.desc.error[0] != '\0')
    head.flags |= kFrameComplaint;
  if (!g.verified_calls.count(fp))
    head.flags |= kFrameUnverified;
  if (call.kind == OpKind::Join)
    head.flags |= kFrameJoined;
  const at::Tensor& p = call.payload;
  const size_t payload_bytes = p.defined() ? p.nbytes() : 0;
  const bool send_inline = p.defined() && payload_bytes <= cap;
  if (send_inline) {
    head.flags |= kFrameInline;
    head.inline_bytes = static_cast<int64_t>(payload_bytes);
  }
  // This thread's buffers, reused: the body reads the payloads before the
  // next job can run on this thread.
  thread_local std::vector<uint8_t> mine_buf, frames_buf;
  mine_buf.assign(frame, 0);
  frames_buf.resize(frame * n);
  std::memcpy(mine_buf.data(), &head, sizeof(head));
  if (send_inline && payload_bytes > 0) {
    std::memcpy(mine_buf.data() + sizeof(head), p.data_ptr(), payload_bytes);
  }
  at::Tensor mine = at::from_blob(
      mine_buf.data(), {static_cast<int64_t>(frame)}, at::kByte);
  at::Tensor frames = at::from_blob(
      frames_buf.data(), {static_cast<int64_t>(frame) * n}, at::kByte);
  comm.allgather(mine, frames, std::vector<size_t>(n, frame));
  const uint8_t* base = frames_buf.data();
  std::vector<FrameHeader> heads(n);
  std::vector<char> joined(n, 0);
  int joined_count = 0;
  bool settled = true;
  bool all_inline = true;
  for (int r = 0; r < n; ++r) {
    std::memcpy(&heads[r], base + r * frame, sizeof(FrameHeader));
    TORCH_INTERNAL_ASSERT(
        heads[r].magic == kDescriptorMagic,
        "ronde: corrupt collective frame from rank ",
        r);
    joined[r] = (heads[r].flags & kFrameJoined) != 0;
    joined_count += joined[r];
    settled = settled && heads[r].fingerprint == heads[0].fingerprint &&
              (heads[r].flags &
               (kFrameComplaint | kFrameUnverified | kFrameJoined)) == 0;
    all_inline = all_inline && (heads[r].flags & kFrameInline) &&
        heads[r].inline_bytes >= 0 &&
        static_cast<size_t>(heads[r].inline_bytes) <= cap;
  }
  Exchanged ex;
  // Who joined since the last checked call: the highest of them is the
  // last to have joined (every rank sees the same frames).
  if (joined_count > 0) {
    for (int r = 0; r < n; ++r) {
      if (joined[r] && (g.joined.empty() || !g.joined[r]))
        g.last_joined = r;
    }
  }
  if (joined_count == n) {
    // Every rank is in ronde::join(): it is over, here and everywhere.
    ex.all_joined = true;
    ex.last_joined = g.last_joined;
    g.joined.clear();
    g.last_joined = -1;
    return ex;
  }
  if (joined_count > 0) {
    g.joined = joined;
    ex.joined = joined;
    ex.joined_count = joined_count;
  } else {
    g.joined.clear();
    g.last_joined = -1;
  }
  if (settled) {
    // Every rank made the same call as this one but for a ragged dim 0.
    ex.all.assign(n, call.desc);
    for (int r = 0; r < n; ++r) {
      if (call.desc.ndim > 0)
        ex.all[r].dims[0] = heads[r].dim0;
    }
  } else {
    ex.all = exchange_descriptors(comm, g, call.desc, ex.joined);
    if (g.verified_calls.size() >= 4096)
      g.verified_calls.clear();  // on every rank alike, at the same call
    // The agreed call's, also on a joined rank: every rank's set stays the
    // same.
    g.verified_calls.insert(fingerprint(ex.all[comm.rank()]));
  }
  if (all_inline) {
    uint8_t* bytes = frames_buf.data();
    for (int r = 0; r < n; ++r) {
      ex.payloads.push_back(bytes + r * frame + sizeof(FrameHeader));
      ex.payload_bytes.push_back(static_cast<size_t>(heads[r].inline_bytes));
    }
  }
  return ex;
}

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
  return Call{kind, &group, name, verify, d, anchor, at::Tensor()};
}

void fail_call(Communicator& comm, const Call& call, const BackendFailure& e) {
  comm.abort();
  World& w = world("collective");
  const Group& g = *call.group;
  throw CommError(
      e.kind,
      to_string(call.kind),
      call.name,
      w.rank,
      w.failed_peers ? w.failed_peers(g.ranks) : std::vector<int>{},
      comm.backend(),
      g.is_global() ? std::string(e.what())
                    : g.label().substr(4) + ": " + e.what());
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
        if (call.verify || !call.group->joined.empty()) {
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
                  ",\"inline\":" + (ex.payloads.empty() ? "false" : "true"));
        }
      },
      blocking,
      what);
}

}  // namespace ronde::detail
