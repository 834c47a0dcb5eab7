// The shared-memory data plane between ranks of one host, on raw buffers (no
// LibTorch here: comm/shm_communicator.cpp adapts tensors). Each rank owns a
// segment that every rank maps: a control block of sequence counters, and two
// slots (double buffering), each an input and an output area of one chunk.
// A collective is a sequence of steps, the same on every rank; each step
// moves at most one chunk per rank. docs/shared_memory.md has the protocol.
#pragma once

#include "comm/dtype_table.h"
#include "runtime/tuning.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ronde::detail::shm {

// The tuning values (runtime/tuning.h: where segments go, the chunk, the
// split size) and this transport's place among the ranks. The chunk is
// rounded down to a multiple of 64, and up to four cache lines per rank.
struct Options : ShmTuning {
  int rank = 0;  // within the ranks this transport connects
  int size = 1;
  // A wait that makes no progress for this long fails.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // How long a wait spins before it sleeps.
  std::chrono::microseconds spin{200};
};

// The job's store, as far as the transport needs it. Keys are this
// transport's own (the caller prefixes them); get() waits for the key.
struct Rendezvous {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key)> get;
};

// Shared memory could not be set up on some rank (no space in the directory,
// no permission, a peer that cannot map the others' segments). Every rank
// throws it with the same message, so that the job can agree on another
// backend. Nothing is left in the directory.
struct Unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A peer died, left, or failed its own collective, or no progress came
// within the timeout, or this rank was interrupted. The transport is
// unusable afterwards.
struct Failure : std::runtime_error {
  enum class Kind { PeerGone, Timeout, Interrupted, Broken };
  Failure(Kind kind, int peer, const std::string& msg, bool exited = false)
      : std::runtime_error(msg), kind(kind), peer(peer), exited(exited) {}
  Kind kind;
  int peer;     // -1 when no peer is to blame
  bool exited;  // the peer's process is known to be gone
};

struct Control;
struct Segment;
class Arena;

// Collectives take the element types and reductions of comm/dtype_table.h.
// One thread calls them at a time; interrupt() may come from any thread.
class Transport {
 public:
  // Collective over every rank: creates this rank's segment, maps the
  // others'. Throws Unavailable (the same on every rank), Failure, or what
  // the rendezvous throws.
  static std::unique_ptr<Transport> connect(
      const Options& options, const Rendezvous& rendezvous);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const {
    return rank_;
  }
  int size() const {
    return size_;
  }

  // In place; then each element times `scale`, as at::mul_ computes it
  // (in float for F32), so the bits are those of the all-reduce and a
  // mul_ after it, without the pass over memory. A scale other than 1 only
  // for the types of can_scale().
  void allreduce(
      void* buf, size_t count, DType dtype, Reduction op, double scale = 1.0);
  static bool can_scale(DType dtype) {
    return dtype == DType::F32 || dtype == DType::F64;
  }
  void broadcast(void* buf, size_t bytes, int root);
  // out receives every rank's bytes in rank order; bytes[r] is rank r's.
  // Of zero-copy size with every rank's `out` in its arena, each rank
  // writes its bytes into every rank's `out`, through no slot.
  void allgatherv(const void* in, void* out, const size_t* bytes);
  // in holds one block per rank, in rank order, counts[r] elements for rank
  // r; out receives this rank's block reduced over every rank.
  void reduce_scatter(
      const void* in,
      void* out,
      const size_t* counts,
      DType dtype,
      Reduction op);
  // send_bytes[r] bytes go to rank r and recv_bytes[r] come from it; both
  // buffers are laid out in rank order.
  void alltoallv(
      const void* in,
      const int64_t* send_bytes,
      void* out,
      const int64_t* recv_bytes);
  void barrier();

  // The call check's frame exchange (comm/call_check.cpp) with this rank's
  // in-place all-reduce in the same step: every rank posts its `frame`
  // (frame_bytes, the same on every rank) and, after it, the `count`
  // elements of `data`; `frames` receives every rank's frame in rank order.
  // A rank whose call cannot ride posts its frame with allgatherv(), the
  // same single step with the frame at the same place. When
  // `reduce_now(frames)` says that every rank posted its data for the same
  // call (every rank sees the same frames, so all answer alike), `data`
  // becomes the reduction of every rank's, in rank order as allreduce()
  // computes it, and this returns true. The data fits in
  // fused_capacity(frame_bytes).
  bool exchange_frames(
      const void* frame,
      size_t frame_bytes,
      void* frames,
      void* data,
      size_t count,
      DType dtype,
      Reduction op,
      const std::function<bool(const void* frames)>& reduce_now);
  // The all-reduce bytes that fit beside a frame of frame_bytes: the rest of
  // a slot's input area, of at most ShmTuning::kMaxFusedBytes.
  size_t fused_capacity(size_t frame_bytes) const;

  // Marks this rank's segment aborted (peers waiting on it fail at once) and
  // makes every later call fail. Safe from any thread, any number of times.
  void interrupt();

  // This rank's arena (shm_arena.h), null without one. An all-reduce of a
  // buffer inside it posts no copy: peers read it where it lies, and when
  // every rank's buffer is in its arena, each rank reduces its slice of
  // the whole buffer and writes it into every rank's buffer
  // (docs/shared_memory.md, "Zero-copy buckets"). Buffers may outlive the
  // transport; the arena lives as long as they do.
  const std::shared_ptr<Arena>& arena() const {
    return arena_;
  }
  // Whether an all-reduce of `bytes` per rank is of the sizes whose
  // buffers are read where they lie when they are in the arenas (from
  // zero_copy_min_bytes). The same on every rank.
  bool zero_copy_size(size_t bytes) const {
    return size_ > 1 && bytes >= zero_copy_min_bytes_;
  }
  // Whether a buffer of `bytes` is worth making in this rank's arena.
  bool zero_copy_fits(size_t bytes) const {
    return arena_ && zero_copy_size(bytes);
  }
  // Where the `bytes` at `data` lie in this rank's arena, when an
  // all-reduce of them says so to its peers (zero_copy_fits()); else
  // nullopt, and the all-reduce copies them in.
  std::optional<size_t> arena_claim(const void* data, size_t bytes) const;
  // All-reduces done so far with every rank's buffer in its arena.
  uint64_t zero_copy_allreduces() const {
    return zero_copy_allreduces_;
  }
  // Reduce-scatters done so far with every rank's input in its arena.
  uint64_t zero_copy_reduce_scatters() const {
    return zero_copy_reduce_scatters_;
  }
  // All-gathers done so far with every rank's output in its arena.
  uint64_t zero_copy_allgathers() const {
    return zero_copy_allgathers_;
  }

 private:
  Transport(
      const Options& options,
      std::vector<Segment> segments,
      std::shared_ptr<Arena> arena);
  // The all-reduce of a buffer that every rank has in its arena (claims_
  // from this step's control blocks): one step, no copy in or out.
  void allreduce_in_arenas(
      size_t count,
      size_t esz,
      void (*reduce)(void*, const void* const*, int, size_t),
      double scale,
      DType dtype,
      uint64_t g);

  // Reads every rank's claim of this step's slot into claims_; whether
  // every rank made one. Every rank reads the same claims after `posted`.
  bool all_claimed(int slot);
  // The all-gather of blocks into outputs that every rank has in its arena
  // (claims_ of step g): `bytes` from `src` at offset `at` of each.
  void allgather_into_arenas(
      const char* src, size_t bytes, size_t at, uint64_t g);

  // Where this rank's input to a reduction into `data` (count * esz
  // bytes, the input itself) is read from: never its own input area. Once
  // posted, peers read those lines, and a read of a modified line can take
  // it from this core's cache (AMD migrates it), so reading it back cost a
  // cross-core miss per line: 0.8 against 0.47 us for a 4 KiB all-reduce at
  // 2 ranks. Ranks 0 and 1 read `data` in place (reduce_n.h allows the
  // output to be input 0 or 1); the others a private copy.
  const void* own_input(const void* data, size_t bytes);
  Control& control(int r) const;
  char* area(int r, int slot, bool out) const;
  void check_usable() const;
  uint64_t begin_step();
  void publish(int counter, uint64_t step);
  void await(int peer, int counter, uint64_t step);
  void await_all(int counter, uint64_t step);
  [[noreturn]] void fail(
      Failure::Kind kind,
      int peer,
      const std::string& msg,
      bool exited = false);
  bool peer_alive(int peer) const;

  int rank_;
  int size_;
  size_t chunk_;
  size_t split_bytes_;
  size_t zero_copy_min_bytes_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;
  bool yield_while_spinning_;
  std::vector<Segment> segments_;  // one per rank, rank order
  std::shared_ptr<Arena> arena_;
  // Every rank's arena, null for none; peers write results into them.
  std::vector<char*> arenas_;
  std::vector<uint64_t> claims_;  // scratch: every rank's claim
  // seen_[peer * kCounters + c]: the highest value of that peer's counter c
  // this rank has loaded (with acquire); await() needs no load below it.
  std::vector<uint64_t> seen_;
  uint64_t zero_copy_allreduces_ = 0;
  uint64_t zero_copy_reduce_scatters_ = 0;
  uint64_t zero_copy_allgathers_ = 0;
  uint64_t step_ = 0;  // steps done, the same on every rank
  std::atomic<bool> interrupted_{false};
  std::string broken_;  // why the transport is unusable; empty while usable
  std::vector<const void*> inputs_;  // scratch: one pointer per rank
  std::vector<char> own_;  // scratch: own_input()'s copy, ranks 2 and up
};

// Names in `dir` that look like ronde segments whose owner is gone (no
// process holds the segment's lock), owned by this user: removed. Called
// once per process before its first segment is made; returns how many.
int remove_stale_segments(const std::string& dir);

}  // namespace ronde::detail::shm
