// Small POSIX helpers that the library, the Gloo module and ronderun share:
// errno as text, a write that survives EINTR and short writes, bytes from
// the kernel's random source, bytes as hex. No LibTorch, no exceptions:
// each caller words its own error.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

namespace ronde::detail {

inline std::string errno_text(int e = errno) {
  return std::strerror(e);
}

// Writes all `n` bytes; false on an error (errno says which).
inline bool write_fully(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    if (w <= 0) {
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// `n` bytes from /dev/urandom; false when it cannot be read in full.
inline bool read_urandom(void* out, size_t n) {
  int fd = -1;
  do {
    fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    return false;
  }
  unsigned char* bytes = static_cast<unsigned char*>(out);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, bytes + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  ::close(fd);
  return got == n;
}

// Lower-case hex of `n` bytes.
inline std::string hex_text(const void* data, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

}  // namespace ronde::detail
