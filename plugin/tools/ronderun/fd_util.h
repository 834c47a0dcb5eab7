// Descriptor helpers of the launcher's pipes: close-on-exec (and
// non-blocking for the ends it polls), and a close that is never retried.
#pragma once

#include <fcntl.h>
#include <unistd.h>

namespace ronde::detail {

inline bool set_fd_flags(int fd, bool nonblocking) {
  const int fd_flags = fcntl(fd, F_GETFD);
  if (fd_flags < 0 || fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC) < 0) {
    return false;
  }
  if (nonblocking) {
    const int fl_flags = fcntl(fd, F_GETFL);
    if (fl_flags < 0 || fcntl(fd, F_SETFL, fl_flags | O_NONBLOCK) < 0) {
      return false;
    }
  }
  return true;
}

inline void close_fd(int& fd) {
  if (fd >= 0) {
    // Retrying close after EINTR may close a reused descriptor on Linux.
    (void)close(fd);
    fd = -1;
  }
}

}  // namespace ronde::detail
