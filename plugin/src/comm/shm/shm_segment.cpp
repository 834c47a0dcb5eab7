// Segments of the shared-memory transport: creation under an unnamed file,
// the owner's lock, naming, mapping and checking a peer's, and the sweep of
// segments whose owner died. See shm_segment.h.
#include "comm/shm/shm_segment.h"

#include "runtime/posix_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>

namespace ronde::detail::shm {
namespace {

constexpr const char* kPrefix = "ronde-";  // every segment's name

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// The owner's lock on byte 0 of its segment: held while the owner lives;
// the kernel drops it when the process ends, however it ends.
bool take_owner_lock(int fd) {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 1;
  return ::fcntl(fd, F_SETLK, &l) == 0;
}

std::string segment_name(const std::string& nonce, int rank) {
  return std::string(kPrefix) + nonce + "-" + std::to_string(rank);
}

}  // namespace

Segment::~Segment() {
  if (base != nullptr)
    ::munmap(base, bytes);
  if (arena != nullptr)
    ::munmap(arena, arena_bytes);
  if (!path.empty())
    ::unlink(path.c_str());
  if (fd >= 0)
    ::close(fd);  // releases the owner's lock: peers see it gone
}

bool owner_lock_held(int fd) {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 1;
  if (::fcntl(fd, F_GETLK, &l) != 0)
    return true;  // cannot tell: assume alive, the timeout still applies
  return l.l_type != F_UNLCK;
}

std::string random_nonce() {
  unsigned char raw[16];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t n = ::getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      throw std::runtime_error("ronde: getrandom failed: " + errno_text(errno));
    }
    got += static_cast<size_t>(n);
  }
  return hex_text(raw, sizeof(raw));
}

// Makes this rank's segment: created unnamed (O_TMPFILE), locked, sized,
// mapped and initialised, and only then linked under its name, so that no
// name ever refers to a half-made segment or to one without a live owner's
// lock. Returns a message instead when it cannot.
std::string create_segment(
    const Options& o, const std::string& nonce, Segment& seg) {
  const size_t bytes = segment_bytes(o.chunk_bytes);
  const std::string path = o.dir + "/" + segment_name(nonce, o.rank);
  const std::string need = mib(bytes) + " per rank, " +
                           mib(bytes * static_cast<size_t>(o.size)) +
                           " for the job";
  bool named = false;
  int fd = ::open(o.dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  // Linking it later goes through /proc/self/fd: without procfs, the
  // exclusive create below.
  if (fd >= 0 && ::access("/proc/self/fd", F_OK) != 0) {
    ::close(fd);
    fd = -1;
  }
  if (fd < 0) {
    // No O_TMPFILE there: an exclusive create, locked at once.
    fd = ::open(
        path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
      return "cannot create " + path + ": " + errno_text(errno);
    named = true;
    seg.path = path;
  }
  seg.fd = fd;
  if (::fchmod(fd, 0600) != 0 || !take_owner_lock(fd))
    return "cannot lock " + path + ": " + errno_text(errno);
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    return "cannot reserve " + need + " in " + o.dir + ": " + errno_text(rc);
  }
  // The arena is a hole until buffers reserve parts of it (shm_arena.h).
  if (o.arena_bytes > 0 &&
      ::ftruncate(
          fd,
          static_cast<off_t>(arena_offset(o.chunk_bytes) + o.arena_bytes)) !=
          0) {
    return "cannot size an arena of " + mib(o.arena_bytes) + " in " + o.dir +
           " (RONDE_SHM_ARENA_BYTES): " + errno_text(errno);
  }
  void* base =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    return "cannot map " + need + " from " + o.dir + ": " + errno_text(errno);
  seg.base = base;
  seg.bytes = bytes;
  auto* c = new (base) Control();
  c->rank = o.rank;
  c->size = o.size;
  c->pid = static_cast<int32_t>(::getpid());
  c->chunk_bytes = o.chunk_bytes;
  c->arena_bytes = o.arena_bytes;
  std::memcpy(
      c->nonce, nonce.data(), std::min(nonce.size(), sizeof(c->nonce) - 1));
  if (!named) {
    const std::string proc = "/proc/self/fd/" + std::to_string(fd);
    if (::linkat(
            AT_FDCWD,
            proc.c_str(),
            AT_FDCWD,
            path.c_str(),
            AT_SYMLINK_FOLLOW) != 0) {
      return "cannot name " + path + ": " + errno_text(errno);
    }
    seg.path = path;
  }
  return "";
}

// Maps a peer's segment and checks that it is the one that peer made for
// this job, private to this user.
std::string open_segment(
    const Options& o, const std::string& nonce, int peer, Segment& seg) {
  const size_t bytes = segment_bytes(o.chunk_bytes);
  const std::string path = o.dir + "/" + segment_name(nonce, peer);
  int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return "cannot open rank " + std::to_string(peer) + "'s segment " + path +
           ": " + errno_text(errno);
  seg.fd = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 ||
      static_cast<size_t>(st.st_size) < bytes) {
    return path + " is not a private segment of this user of " +
           std::to_string(bytes) + " bytes";
  }
  void* base =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    return "cannot map " + path + ": " + errno_text(errno);
  seg.base = base;
  seg.bytes = bytes;
  const auto* c = static_cast<const Control*>(base);
  if (c->magic != kMagic || c->version != kVersion || c->rank != peer ||
      c->size != o.size || c->chunk_bytes != o.chunk_bytes ||
      std::strncmp(c->nonce, nonce.c_str(), sizeof(c->nonce)) != 0) {
    return path + " does not hold rank " + std::to_string(peer) +
           "'s segment of this job";
  }
  // The peer's arena, of the size the peer chose; none when it has none.
  const size_t arena = c->arena_bytes;
  const size_t at = arena_offset(o.chunk_bytes);
  if (static_cast<size_t>(st.st_size) != (arena > 0 ? at + arena : bytes))
    return path + " is not a private segment of this user of " +
           std::to_string(arena > 0 ? at + arena : bytes) + " bytes";
  if (arena > 0) {
    void* a = ::mmap(
        nullptr,
        arena,
        PROT_READ | PROT_WRITE,
        MAP_SHARED | MAP_NORESERVE,
        fd,
        static_cast<off_t>(at));
    if (a == MAP_FAILED)
      return "cannot map rank " + std::to_string(peer) + "'s arena of " +
             mib(arena) + " (RONDE_SHM_ARENA_BYTES): " + errno_text(errno);
    seg.arena = a;
    seg.arena_bytes = arena;
  }
  return "";
}

int remove_stale_segments(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return 0;
  int removed = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0)
      continue;
    const std::string path = dir + "/" + e->d_name;
    int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
      continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_uid == ::geteuid() && !owner_lock_held(fd)) {
      if (::unlink(path.c_str()) == 0)
        ++removed;
    }
    ::close(fd);
  }
  ::closedir(d);
  return removed;
}

}  // namespace ronde::detail::shm
