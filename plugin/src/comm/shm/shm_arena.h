// A rank's arena: the part of its segment's file after the areas, which
// every peer maps, for buffers that peers read where they lie (the gradient
// buckets). Address space only until a buffer is allocated: then its pages
// are reserved (a full directory refuses the buffer, never a later SIGBUS),
// and given back when it is released. Ranks need not agree on offsets:
// each all-reduce step says where each rank's input lies (the claims in
// the control block). See docs/shared_memory.md, "Zero-copy buckets".
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace ronde::detail::shm {

class Arena {
 public:
  // Maps `bytes` of the file open as `fd` from `file_offset`. Takes a
  // duplicate of fd, closed only when the arena goes (after the transport:
  // closing any descriptor of the file drops the owner's lock). Throws
  // std::runtime_error when it cannot map.
  Arena(int fd, size_t file_offset, size_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // The offset of `bytes` (rounded up to whole pages) of zeros in the
  // arena, reserved; nullopt when the arena or the directory has no room.
  // Any thread.
  std::optional<size_t> allocate(size_t bytes);
  // Gives back what allocate() returned at `offset` (the same `bytes`).
  // Any thread; the buffer must be out of every collective.
  void release(size_t offset, size_t bytes);

  char* base() const {
    return base_;
  }
  size_t bytes() const {
    return bytes_;
  }
  // Where [p, p + n) starts in the arena, or nullopt when it is not
  // wholly inside.
  std::optional<size_t> offset_of(const void* p, size_t n) const {
    const auto* c = static_cast<const char*>(p);
    if (c < base_ || n > bytes_ || static_cast<size_t>(c - base_) > bytes_ - n)
      return std::nullopt;
    return static_cast<size_t>(c - base_);
  }
  // Bytes allocated now, for tests and messages.
  size_t in_use() const;

 private:
  static size_t pages(size_t bytes);

  int fd_;
  size_t file_offset_;
  size_t bytes_;
  char* base_;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced; guarded
  size_t in_use_ = 0;              // guarded
};

}  // namespace ronde::detail::shm
