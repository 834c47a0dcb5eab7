// Output lines, their rank tags and ronderun's sinks (see output.h).
#include "output.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ronde::detail {

std::string rank_prefix(int rank) {
  return "[" + std::to_string(rank) + "] ";
}

std::string tag_lines(
    const std::string& prefix, const char* data, size_t size) {
  std::string text;
  text.reserve(size + prefix.size() * 4);
  size_t start = 0;
  while (start < size) {
    const void* found = memchr(data + start, '\n', size - start);
    const size_t end =
        found == nullptr
            ? size
            : static_cast<size_t>(static_cast<const char*>(found) - data) + 1;
    text += prefix;
    text.append(data + start, end - start);
    start = end;
  }
  return text;
}

size_t append_and_find_lines(
    std::string& pending, const char* data, size_t size) {
  const size_t scanned = pending.size();
  pending.append(data, size);
  for (size_t i = pending.size(); i > scanned; --i) {
    if (pending[i - 1] == '\n') {
      return i;
    }
  }
  return 0;
}

void Sinks::write(int fd, const char* data, size_t size) {
  if (fd < 0 || fd > 2 || broken_[fd]) {
    return;
  }
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Our stdout may share a non-blocking file description with the shell.
      struct pollfd pfd = {fd, POLLOUT, 0};
      if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
        broken_[fd] = true;
        return;
      }
      continue;
    }
    broken_[fd] = true;
    return;
  }
}

void Sinks::message(const std::string& text) {
  const std::string line = "ronderun: " + text + "\n";
  write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace ronde::detail
