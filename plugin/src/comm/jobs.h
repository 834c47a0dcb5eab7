// How a collective becomes a job on the communication worker: the call's
// descriptor and the exchange that checks it, the stream fence for device
// tensors, and the translation of a backend failure into a CommError that
// names the suspects. Each collective's body (collectives.cpp) runs inside.
#pragma once

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "comm/descriptor.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {

struct Group;

struct Call {
  OpKind kind;
  // The process set it runs on (comm/world.h); lives until the job ran
  // (remove_process_set() waits for the set's queued jobs).
  Group* group = nullptr;
  std::string name;
  bool verify = true;
  Descriptor desc;
  // The input, when it lives on a device: its device and the caller's
  // stream there decide how the job orders its work.
  at::Tensor anchor;
  // A host tensor whose bytes may ride in the check's frame (descriptor.h):
  // when every rank's fits, the body gets them all and the collective needs
  // no further exchange. Read when the job starts.
  at::Tensor payload;
  // An in-place all-reduce of `payload` with this reduction (and no
  // prescale), which a backend may carry with the check's frames.
  std::optional<BackendOp> fused_op;
};

// What the check told the body.
struct Exchanged {
  // Every rank's descriptor, in rank order; empty when the call skipped the
  // check (verify false).
  std::vector<Descriptor> all;
  // Every rank's payload bytes, when every rank sent its payload in the
  // frame; else empty. They point into a buffer of the thread running the
  // job (writable, valid until its next job).
  std::vector<uint8_t*> payloads;
  std::vector<size_t> payload_bytes;
  // Ranks in ronde::join() (by set rank; empty: none). Their descriptors in
  // `all` are the call the others made, with dim 0 zero where it may
  // differ: they take part with an input that changes nothing.
  std::vector<char> joined;
  int joined_count = 0;
  // Every rank has joined: the join is over, and this set rank joined last.
  bool all_joined = false;
  int last_joined = -1;
  // The backend all-reduced the call's payload in the check's own exchange
  // (Call::fused_op): the body only finishes the reduction.
  bool reduced = false;
};

// A call on `t` (undefined for a barrier) by this rank in `group`; `error`
// is this rank's complaint about its input, empty when there is none.
Call make_call(
    Group& group,
    OpKind kind,
    const at::Tensor& t,
    const std::string& name,
    bool verify,
    int op,
    int root,
    std::string error);

// The collective's own work, run by the job after the check.
using Body = std::function<void(
    Communicator&, HandleState&, const Exchanged&, const Call&)>;

// Queues the job on its group's worker. `uses` are tensors made on the caller's
// side that the job reads or writes: on a device they are marked as used by the
// job's stream too. `blocking`: the caller waits on the handle at once, so the
// job may run on the caller's thread (see CommWorker::submit).
Handle submit(
    Call call, Body body, std::vector<at::Tensor> uses, bool blocking);

// Queues `task` on the worker of `set` as a job of its own, in submission
// order with the set's collectives: those the task submits to the same set
// run inside it, at once (CommWorker::submit). A communication hook's way
// onto the communication thread: a thread waiting on it never runs it
// (CommWorker::help). `what` names it for the stall inspector.
Handle submit_task(
    const ProcessSet& set, std::function<void()> task, std::string what);

// A backend failure during `call`: aborts the communicator (so that peers
// blocked on this rank fail fast too) and throws a CommError naming the
// collective and the suspect ranks.
[[noreturn]] void fail_call(
    Communicator& comm, const Call& call, const BackendFailure& e);

// Runs a backend step of a job, turning a peer or network failure into the
// CommError of fail_call().
template <typename F>
void guarded(Communicator& comm, const Call& call, F&& fn) {
  try {
    fn();
  } catch (const BackendFailure& e) {
    fail_call(comm, call, e);
  }
}

}  // namespace ronde::detail
