// Finding the store client's socket and bounding it (store_socket.h).
#include "runtime/store_socket.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <vector>

namespace ronde::detail {
namespace {

int peer_port(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0)
    return -1;
  if (peer.ss_family == AF_INET)
    return ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port);
  if (peer.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<sockaddr_in6*>(&peer)->sin6_port);
  return -1;
}

bool is_tcp_stream(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
         type == SOCK_STREAM;
}

void bound(int fd, std::chrono::milliseconds timeout) {
  const int64_t ms = std::max<int64_t>(timeout.count(), 1000);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  // Unacknowledged data (a request the store's host never received)
  // closes the connection after `timeout`, instead of the kernel's
  // retransmission limit; it also bounds the keepalive probes below.
  const unsigned int user_timeout = static_cast<unsigned int>(ms);
  ::setsockopt(
      fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  // An idle connection (a thread polling in a long wait) learns of a cut
  // link from the probes: the first after a third of the timeout.
  const int on = 1;
  const int idle = static_cast<int>(std::max<int64_t>(1, ms / 3000));
  const int interval = std::max(1, idle / 2);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
}

}  // namespace

std::set<int> open_sockets() {
  std::set<int> fds;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr)
    return fds;
  const int own = ::dirfd(dir);
  while (dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own)
      continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) == 0 && S_ISSOCK(st.st_mode))
      fds.insert(static_cast<int>(fd));
  }
  ::closedir(dir);
  return fds;
}

namespace {

// This process's TCP connections to `port`: a store client's. A server in
// this process (rank 0) listens and accepts on the port, but a connection
// it accepted has the client's port at the other end.
std::vector<int> connections_to(int port) {
  std::vector<int> fds;
  for (int fd : open_sockets()) {
    if (is_tcp_stream(fd) && peer_port(fd) == port)
      fds.push_back(fd);
  }
  return fds;
}

}  // namespace

void bound_store_connections(
    const std::set<int>& before, int port, std::chrono::milliseconds timeout) {
  for (int fd : connections_to(port)) {
    if (!before.count(fd))
      bound(fd, timeout);
  }
}

void wait_until_closed_by_server(int port, std::chrono::milliseconds timeout) {
  std::vector<pollfd> open;
  for (int fd : connections_to(port))
    open.push_back(pollfd{fd, POLLRDHUP, 0});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!open.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return;
    if (::poll(open.data(), open.size(), static_cast<int>(left.count())) < 0 &&
        errno != EINTR)
      return;
    open.erase(
        std::remove_if(
            open.begin(),
            open.end(),
            [](const pollfd& p) {
              return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
            }),
        open.end());
  }
}

}  // namespace ronde::detail
