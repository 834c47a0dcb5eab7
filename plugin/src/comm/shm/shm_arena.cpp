// The arena of shm_arena.h: first-fit allocation over a free list, pages
// reserved with fallocate and given back by punching holes.
#include "comm/shm/shm_arena.h"

#include "runtime/posix_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <stdexcept>
#include <string>

namespace ronde::detail::shm {

Arena::Arena(int fd, size_t file_offset, size_t bytes)
    : fd_(::fcntl(fd, F_DUPFD_CLOEXEC, 0)),
      file_offset_(file_offset),
      bytes_(bytes / pages(1) * pages(1)),
      base_(nullptr) {
  if (fd_ < 0)
    throw std::runtime_error(
        "cannot keep the arena open: " + errno_text(errno));
  void* p = ::mmap(
      nullptr,
      bytes_,
      PROT_READ | PROT_WRITE,
      MAP_SHARED | MAP_NORESERVE,
      fd_,
      static_cast<off_t>(file_offset_));
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd_);
    throw std::runtime_error(
        "cannot map an arena of " + std::to_string(bytes_ >> 20) +
        " MiB: " + errno_text(e));
  }
  base_ = static_cast<char*>(p);
  free_[0] = bytes_;
}

Arena::~Arena() {
  ::munmap(base_, bytes_);
  ::close(fd_);
}

size_t Arena::pages(size_t bytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

std::optional<size_t> Arena::allocate(size_t bytes) {
  const size_t n = pages(std::max<size_t>(bytes, 1));
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n)
      continue;
    const size_t at = it->first;
    const size_t rest = it->second - n;
    // Reserve the pages now: a directory without room refuses here, not
    // with SIGBUS when backward first writes a gradient.
    if (::posix_fallocate(
            fd_,
            static_cast<off_t>(file_offset_ + at),
            static_cast<off_t>(n)) != 0)
      return std::nullopt;
    free_.erase(it);
    if (rest > 0)
      free_[at + n] = rest;
    in_use_ += n;
    return at;
  }
  return std::nullopt;
}

void Arena::release(size_t offset, size_t bytes) {
  const size_t n = pages(std::max<size_t>(bytes, 1));
  // Zeros for the next buffer there, and the memory back to the system.
  ::fallocate(
      fd_,
      FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
      static_cast<off_t>(file_offset_ + offset),
      static_cast<off_t>(n));
  std::lock_guard<std::mutex> lock(mutex_);
  in_use_ -= n;
  auto next = free_.emplace(offset, n).first;
  // Coalesce with the free range after, then with the one before.
  auto after = std::next(next);
  if (after != free_.end() && next->first + next->second == after->first) {
    next->second += after->second;
    free_.erase(after);
  }
  if (next != free_.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == next->first) {
      before->second += next->second;
      free_.erase(next);
    }
  }
}

size_t Arena::in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

}  // namespace ronde::detail::shm
