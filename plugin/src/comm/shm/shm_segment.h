// One rank's shared-memory segment: its layout (a control block, then two
// slots of an input and an output area each), how it is made, named,
// mapped by peers, checked and removed. The step protocol on top of it is
// shm_transport.cpp's. See docs/shared_memory.md, "Segments".
#pragma once

#include "comm/shm/shm_transport.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace ronde::detail::shm {

// The identity every segment starts with; a peer checks it before use.
constexpr uint64_t kMagic = 0x316d73656472'6f72;  // "rondesm1"
constexpr uint32_t kVersion = 3;
// The control block's bytes at the head of a segment; the areas follow.
constexpr size_t kControlBytes = 4096;
constexpr size_t kLine = 64;  // a cache line: counters never share one

enum State : uint32_t { kLive = 0, kAborted = 1, kClosed = 2 };
constexpr uint64_t kNoClaim = ~uint64_t{0};
enum CounterId : int { kPosted = 0, kReduced = 1, kConsumed = 2 };
constexpr int kCounters = 3;

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// The head of a rank's segment. Written by its owner: the identity before
// any peer maps it, the counters and the state afterwards. Peers write
// `sleepers` (they announce themselves before sleeping on `wake`).
struct Control {
  uint64_t magic = kMagic;
  uint32_t version = kVersion;
  int32_t rank = 0;
  int32_t size = 0;
  int32_t pid = 0;  // for messages only
  uint64_t chunk_bytes = 0;
  char nonce[40] = {0};
  // counters[c]: the last step in which the owner reached point c of it.
  struct alignas(kLine) Counter {
    std::atomic<uint64_t> value{0};
  };
  Counter counters[kCounters];
  alignas(kLine) std::atomic<uint32_t> wake{0};  // futex word
  std::atomic<uint32_t> sleepers{0};
  std::atomic<uint32_t> state{kLive};
  // The CPU the owner ran on when it last began a step (sched_getcpu()):
  // a waiter on the same CPU yields it instead of spinning, since the
  // owner cannot run while it spins.
  std::atomic<int32_t> cpu{-1};
  // The owner's arena (shm_arena.h): its bytes, after the areas at
  // arena_offset(); 0 when it has none.
  uint64_t arena_bytes = 0;
  // claims[s]: where in the owner's arena its input of the all-reduce step
  // using slot s lies, or kNoClaim when it is in the input area (only
  // all-reduces of zero-copy size write and read them). Written before
  // `posted`, read by peers after it.
  alignas(kLine) std::atomic<uint64_t> claims[2] = {{kNoClaim}, {kNoClaim}};
};
static_assert(sizeof(Control) <= kControlBytes);

struct Segment {
  int fd = -1;
  void* base = nullptr;  // the control block and the areas
  size_t bytes = 0;
  // A peer's arena, mapped apart from the areas; the owner maps its own
  // as an Arena (shm_arena.h), which may outlive the segment.
  void* arena = nullptr;
  size_t arena_bytes = 0;
  std::string path;  // set while this process must unlink it

  Segment() = default;
  Segment(Segment&& o) noexcept
      : fd(o.fd),
        base(o.base),
        bytes(o.bytes),
        arena(o.arena),
        arena_bytes(o.arena_bytes),
        path(std::move(o.path)) {
    o.fd = -1;
    o.base = nullptr;
    o.arena = nullptr;
    o.path.clear();
  }
  Segment& operator=(Segment&&) = delete;
  // Unmaps, unlinks while named, and closes: the owner's lock goes with
  // the descriptor, so peers see the owner gone.
  ~Segment();
};

// Bytes of a segment whose areas hold `chunk` bytes each.
inline size_t segment_bytes(size_t chunk) {
  return kControlBytes + 4 * chunk;
}

// Where the arena starts in a segment's file: after the areas, on a 2 MiB
// boundary (a huge page, where the directory's mount gives them).
inline size_t arena_offset(size_t chunk) {
  constexpr size_t kAlign = size_t{2} << 20;
  return (segment_bytes(chunk) + kAlign - 1) / kAlign * kAlign;
}

// Whether the owner of the segment open as `fd` still lives (it holds its
// lock until it ends, however it ends); true when it cannot be told.
bool owner_lock_held(int fd);

// A fresh job nonce: the segments' names and identity.
std::string random_nonce();

// Makes this rank's segment (o.rank) under `nonce` in o.dir, initialised
// and named; a message instead when it cannot. Only a fully made segment
// with a live owner is ever named.
std::string create_segment(
    const Options& o, const std::string& nonce, Segment& seg);

// Maps `peer`'s segment and checks that it is the one that peer made for
// this job, private to this user; a message instead when it is not.
std::string open_segment(
    const Options& o, const std::string& nonce, int peer, Segment& seg);

}  // namespace ronde::detail::shm
