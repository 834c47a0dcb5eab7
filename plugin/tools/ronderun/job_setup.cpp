// Port, job id and rendezvous address of a job (see job_setup.h).
#include "job_setup.h"

#include "runtime/net_address.h"
#include "runtime/posix_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace ronde::detail {
namespace {

// The numeric address `host` resolves to here (IPv4 first); empty when it
// does not resolve.
std::string resolve_numeric(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) {
    return "";
  }
  std::string v4;
  std::string v6;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a->ai_family == AF_INET && v4.empty()) {
      inet_ntop(
          AF_INET,
          &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr,
          buf,
          sizeof(buf));
      v4 = buf;
    } else if (a->ai_family == AF_INET6 && v6.empty()) {
      inet_ntop(
          AF_INET6,
          &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr,
          buf,
          sizeof(buf));
      v6 = buf;
    }
  }
  freeaddrinfo(res);
  return v4.empty() ? v6 : v4;
}

// The first host is this machine: the address this machine sends from on
// the route to the first other host, "" when no route shows one.
std::string local_address_towards_others(
    const Options& options, const std::string& resolved, bool& remote) {
  remote = false;
  for (const HostSlots& h : options.hosts) {
    if (resolve_numeric(h.host) == resolved || is_local_host(h.host)) {
      continue;
    }
    remote = true;
    std::string source = route_source_address(h.host, options.port);
    if (!source.empty() && !is_loopback_address(source)) {
      return source;
    }
  }
  return "";
}

}  // namespace

bool ensure_std_fds_open() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) {
      continue;
    }
    int opened = -1;
    do {
      opened = open("/dev/null", O_RDWR);
    } while (opened < 0 && errno == EINTR);
    if (opened != fd) {
      return false;
    }
  }
  return true;
}

std::string pick_free_port(Options& options) {
  const int sock = socket(AF_INET, SOCK_STREAM, 0);
  if (sock < 0) {
    return "cannot pick a free port: socket: " + errno_text();
  }
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  // Free on every interface, for a rank 0 on another host at least likely.
  addr.sin_addr.s_addr =
      htonl(options.hosts.empty() ? INADDR_LOOPBACK : INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok =
      bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  std::string error;
  if (!ok) {
    error = "cannot pick a free port: " + errno_text();
  } else {
    options.port = ntohs(addr.sin_port);
  }
  (void)close(sock);
  return error;
}

std::string make_job_id() {
  unsigned char bytes[8] = {};
  if (!read_urandom(bytes, sizeof(bytes))) {
    // Only needs to differ between concurrent jobs on this host.
    unsigned long long mix = static_cast<unsigned long long>(
        std::chrono::system_clock::now().time_since_epoch().count());
    mix ^= static_cast<unsigned long long>(
               std::chrono::steady_clock::now().time_since_epoch().count())
           << 17;
    for (unsigned char& byte : bytes) {
      mix = mix * 6364136223846793005ULL + 1442695040888963407ULL;
      byte = static_cast<unsigned char>(mix >> 56);
    }
  }
  return "ronde-" + std::to_string(getpid()) + "-" +
         hex_text(bytes, sizeof(bytes));
}

// Rank 0 hosts the store on the first host: its address as this machine
// resolves it (ssh reaches it by the same name), unless that is loopback,
// in which case the first host is this machine and the address is the one
// this machine sends from on the route to the other hosts.
std::string choose_rendezvous_address(Options& options) {
  if (options.host_given || options.hosts.empty()) {
    return "";
  }
  const std::string& first = options.hosts.front().host;
  const std::string resolved = resolve_numeric(first);
  if (!resolved.empty() && !is_loopback_address(resolved)) {
    options.host = resolved;
    return "";
  }
  if (resolved.empty()) {
    return "cannot resolve the first host '" + first +
           "' (rank 0 hosts the rendezvous there); pass --host with an "
           "address of it that every host can reach";
  }
  bool remote = false;
  const std::string source =
      local_address_towards_others(options, resolved, remote);
  if (!source.empty()) {
    options.host = source;
    return "";
  }
  if (!remote) {
    options.host = kDefaultHost;  // every rank on this machine
    return "";
  }
  return "the first host '" + first + "' resolves to " + resolved +
         " (loopback) and no route to the other hosts shows this machine's "
         "address; pass --host with an address of it that every host reaches";
}

}  // namespace ronde::detail
