// The call check: before a collective's body runs, every member learns that
// every other made the same call, in (usually) one exchange of fixed-size
// frames. See README.md, "Collectives" (what is checked, what a mismatch
// says) and "Uneven inputs: join" (what a joined member's frame tells).
//
// Every rank sends a frame of the same size (descriptor.h) with its
// descriptor's fingerprint and, when it fits, its payload. Every rank then
// sees the same frames and takes the same decision: when every fingerprint
// is equal and was verified in full before, the call is checked; otherwise
// (a first call, a mismatch, a complaint, a joined member) the full
// descriptors follow and check_descriptors() throws or passes on every rank
// alike, which verifies the fingerprint for next time. A mismatch thus
// still fails on every rank; a call seen before costs one exchange, which
// carries a small collective's data too. Where the backend can carry an
// all-reduce's input beside the frames (shared memory), a call seen before
// is reduced in that same exchange when every frame settles it.
#include "comm/call_check.h"

#include "comm/jobs.h"
#include "comm/world.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <string>

namespace ronde::detail {

void VerifiedCalls::add(uint64_t fingerprint) {
  if (fingerprints_.size() >= kMaxVerifiedCalls)
    fingerprints_.clear();  // on every member alike, at the same call
  fingerprints_.insert(fingerprint);
}

namespace {

// The frames of one check, as every rank read them: the same everywhere.
struct Frames {
  uint8_t* base = nullptr;  // one frame per rank, in rank order
  size_t size = 0;          // of each frame
  std::vector<FrameHeader> heads;
  std::vector<char> joined;  // by set rank
  int joined_count = 0;
  // The same verified call everywhere, with no complaint and nobody joined.
  bool settled = true;
  // Every frame carries its rank's payload.
  bool all_inline = true;
};

// The payload bytes this job's frames carry: none where a round trip costs
// about what copying the frames does. Every rank's host backend is the
// same, so every rank sizes frames alike.
size_t payload_capacity(const Communicator& comm) {
  return comm.prefers_inline_payloads() ? inline_capacity(comm.size()) : 0;
}

// The all-reduce that this call's frame may carry (Call::fused_op), when
// the backend can carry it beside frames of `frame_bytes` and would copy it
// anyway.
bool fusable(const Communicator& comm, const Call& call, size_t frame_bytes) {
  return call.fused_op.has_value() && call.payload.defined() &&
         call.payload.is_contiguous() &&
         call.payload.nbytes() <= comm.fused_capacity(frame_bytes) &&
         !comm.reads_in_place(call.payload);
}

FrameHeader header_of(
    const Call& call, const VerifiedCalls& verified, size_t cap, bool fused) {
  FrameHeader head;
  head.fingerprint = fingerprint(call.desc);
  head.dim0 = call.desc.ndim > 0 ? call.desc.dims[0] : 0;
  if (call.desc.error[0] != '\0')
    head.flags |= kFrameComplaint;
  if (!verified.contains(head.fingerprint))
    head.flags |= kFrameUnverified;
  if (call.kind == OpKind::Join)
    head.flags |= kFrameJoined;
  if (fused)
    head.flags |= kFrameFused;
  const at::Tensor& p = call.payload;
  if (p.defined() && p.nbytes() <= cap) {
    head.flags |= kFrameInline;
    head.inline_bytes = static_cast<int64_t>(p.nbytes());
  }
  return head;
}

// Reads the frames into `f`, whose vectors keep their capacity from call
// to call: a checked call allocates nothing here.
void read_frames(Frames& f, uint8_t* base, int n, size_t size, size_t cap) {
  f.base = base;
  f.size = size;
  f.heads.resize(n);
  f.joined.assign(n, 0);
  f.joined_count = 0;
  f.settled = true;
  f.all_inline = true;
  for (int r = 0; r < n; ++r) {
    const FrameHeader& h = f.heads[r] = decode_frame_header(base + r * size, r);
    f.joined[r] = (h.flags & kFrameJoined) != 0;
    f.joined_count += f.joined[r];
    f.settled =
        f.settled && h.fingerprint == f.heads[0].fingerprint &&
        (h.flags & (kFrameComplaint | kFrameUnverified | kFrameJoined)) == 0;
    f.all_inline = f.all_inline && (h.flags & kFrameInline) &&
                   h.inline_bytes >= 0 &&
                   static_cast<size_t>(h.inline_bytes) <= cap;
  }
}

// The frames as read in the middle of the backend's step, where a fused
// all-reduce asks whether they settle the call; kept for after it.
struct FusedAsk {
  int n;
  size_t size, cap;
  Frames* into;
  bool read = false;

  // Whether the frames settle the call and every one carried its rank's
  // all-reduce input. Never throws: a bad frame answers no, and reading
  // the frames again after the step reports it.
  bool settled_and_fused(const uint8_t* base) {
    try {
      read_frames(*into, const_cast<uint8_t*>(base), n, size, cap);
      read = true;
    } catch (...) {
      return false;
    }
    if (!into->settled || into->joined_count > 0)
      return false;
    for (const FrameHeader& h : into->heads) {
      if ((h.flags & kFrameFused) == 0)
        return false;
    }
    return true;
  }
};

// Sends this rank's frame and receives every rank's; with `fused`, the
// backend may all-reduce the call's payload in the same exchange (*reduced).
// The frames are this thread's, reused by its next call.
const Frames& exchange_frames(
    Communicator& comm,
    const FrameHeader& head,
    const Call& call,
    size_t cap,
    bool fused,
    bool* reduced) {
  const at::Tensor& payload = call.payload;
  const int n = comm.size();
  const size_t size = sizeof(FrameHeader) + cap;
  // This thread's buffers, reused: the body reads the payloads before the
  // next job can run on this thread.
  thread_local std::vector<uint8_t> mine_buf, frames_buf;
  thread_local Frames frames;
  mine_buf.resize(size);
  frames_buf.resize(size * n);
  const bool carried = (head.flags & kFrameInline) && head.inline_bytes > 0;
  encode_frame(
      head, carried ? payload.data_ptr() : nullptr, mine_buf.data(), size);
  FusedAsk ask{n, size, cap, &frames};
  Communicator::FusedAllreduce job;
  if (fused) {
    job.work = payload;
    job.op = *call.fused_op;
    job.settled = [a = &ask](const uint8_t* all) {
      return a->settled_and_fused(all);
    };
  }
  *reduced = comm.exchange_frames(
      mine_buf.data(), size, frames_buf.data(), fused ? &job : nullptr);
  // Unless the backend's question already read them.
  if (!ask.read)
    read_frames(frames, frames_buf.data(), n, size, cap);
  return frames;
}

// Records who joined since the last checked call (the highest of them is
// the last to have joined: every rank sees the same frames) and tells the
// body. Returns true when every rank is in ronde::join(): it is over, here
// and everywhere.
bool track_join(JoinState& state, const Frames& f, Exchanged& ex) {
  const int n = static_cast<int>(f.joined.size());
  if (f.joined_count > 0) {
    for (int r = 0; r < n; ++r) {
      if (f.joined[r] && (!state.anyone() || !state.joined[r]))
        state.last_joined = r;
    }
  }
  if (f.joined_count == n) {
    ex.all_joined = true;
    ex.last_joined = state.last_joined;
    state = JoinState();
    return true;
  }
  if (f.joined_count > 0) {
    state.joined = f.joined;
    ex.joined = f.joined;
    ex.joined_count = f.joined_count;
  } else {
    state = JoinState();
  }
  return false;
}

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

// Every rank's descriptor into `ex.all`: from the frames when they settle
// the call, else from the full exchange, which verifies the call.
void agree_on_descriptors(
    Communicator& comm,
    Group& g,
    const Call& call,
    const Frames& f,
    Exchanged& ex) {
  const int n = comm.size();
  if (f.settled) {
    // An all-reduce done in the exchange needs no descriptors.
    if (ex.reduced)
      return;
    // Every rank made the same call as this one but for a ragged dim 0.
    ex.all.assign(n, call.desc);
    for (int r = 0; r < n; ++r) {
      if (call.desc.ndim > 0)
        ex.all[r].dims[0] = f.heads[r].dim0;
    }
    return;
  }
  ex.all = exchange_descriptors(comm, g, call.desc, ex.joined);
  // The agreed call's, also on a joined rank: every rank's set stays the
  // same.
  g.verified_calls.add(fingerprint(ex.all[comm.rank()]));
}

// Hands the body every rank's payload when every frame carried one.
void take_inline_payloads(const Frames& f, Exchanged& ex) {
  if (!f.all_inline)
    return;
  for (size_t r = 0; r < f.heads.size(); ++r) {
    ex.payloads.push_back(frame_payload(f.base + r * f.size));
    ex.payload_bytes.push_back(static_cast<size_t>(f.heads[r].inline_bytes));
  }
}

}  // namespace

Exchanged check_call(Communicator& comm, Group& g, const Call& call) {
  const size_t cap = payload_capacity(comm);
  const bool fused = fusable(comm, call, sizeof(FrameHeader) + cap);
  const FrameHeader head = header_of(call, g.verified_calls, cap, fused);
  Exchanged ex;
  const Frames& frames =
      exchange_frames(comm, head, call, cap, fused, &ex.reduced);
  if (track_join(g.join, frames, ex))
    return ex;
  agree_on_descriptors(comm, g, call, frames, ex);
  if (!ex.reduced)
    take_inline_payloads(frames, ex);
  return ex;
}

}  // namespace ronde::detail
