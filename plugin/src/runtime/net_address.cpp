// Interfaces, filters and routes for the advertised address.
#include "runtime/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace ronde::detail {
namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos)
      comma = text.size();
    std::string item = text.substr(start, comma - start);
    if (!item.empty())
      out.push_back(item);
    start = comma + 1;
  }
  return out;
}

std::string interface_list(const std::vector<NetInterface>& interfaces) {
  std::string out;
  for (const auto& i : interfaces) {
    if (!out.empty())
      out += ", ";
    out += i.name + " " + i.address;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::vector<NetInterface> list_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || !(a->ifa_flags & IFF_UP))
      continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6)
      continue;
    if (family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr))
        continue;
    }
    NetInterface i;
    i.name = a->ifa_name;
    i.address = numeric(a->ifa_addr);
    i.ipv6 = family == AF_INET6;
    i.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(i);
  }
  ::freeifaddrs(list);
  return out;
}

bool IfnameFilter::matches(const std::string& ifname) const {
  bool listed = false;
  for (const auto& n : names) {
    if (exact ? ifname == n : ifname.rfind(n, 0) == 0) {
      listed = true;
      break;
    }
  }
  return exclude ? !listed : listed;
}

IfnameFilter parse_ifname_filter(const std::string& spec, bool exact) {
  IfnameFilter f;
  f.exact = exact;
  std::string rest = spec;
  if (!rest.empty() && rest[0] == '^') {
    f.exclude = true;
    rest = rest.substr(1);
  }
  if (!rest.empty() && rest[0] == '=') {
    f.exact = true;
    rest = rest.substr(1);
  }
  f.names = split_commas(rest);
  return f;
}

std::optional<std::string> filtered_address(
    const std::vector<NetInterface>& interfaces,
    const IfnameFilter& filter,
    bool want_ipv6) {
  // Excluding lists say what not to use; loopback is never what they mean.
  auto passes = [&](const NetInterface& i) {
    return filter.matches(i.name) && !(filter.exclude && i.loopback);
  };
  for (const auto& i : interfaces) {
    if (passes(i) && i.ipv6 == want_ipv6)
      return i.address;
  }
  for (const auto& i : interfaces) {
    if (passes(i))
      return i.address;
  }
  return std::nullopt;
}

std::string route_source_address(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port > 0 ? port : 9);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0)
    return "";
  std::string found;
  for (addrinfo* a = res; a != nullptr && found.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      continue;
    // connect() on a datagram socket only picks the route and the source.
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
        found = numeric(reinterpret_cast<sockaddr*>(&local));
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return found;
}

bool is_loopback_address(const std::string& address) {
  if (address == "localhost" || address == "::1")
    return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1)
    return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, address.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6))
      return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6))
      return v6.s6_addr[12] == 127;
  }
  return false;
}

AddressChoice choose_address(
    const AddressRequest& request,
    const std::vector<NetInterface>& interfaces) {
  if (!request.option.empty())
    return {request.option, "InitOptions::hostname"};
  if (!request.hostname.empty())
    return {request.hostname, "RONDE_HOSTNAME"};
  const std::string& rdv = request.rendezvous_addr;
  if (!request.ifname.empty()) {
    const bool exact = request.ifname_variable == "GLOO_SOCKET_IFNAME";
    IfnameFilter filter = parse_ifname_filter(request.ifname, exact);
    in6_addr v6{};
    const bool want_ipv6 = ::inet_pton(AF_INET6, rdv.c_str(), &v6) == 1;
    if (auto a = filtered_address(interfaces, filter, want_ipv6))
      return {*a, request.ifname_variable + "=" + request.ifname};
    throw std::runtime_error(
        request.ifname_variable + "=" + request.ifname +
        " matches no interface with an address here (interfaces: " +
        interface_list(interfaces) + ")");
  }
  if (rdv.empty() || is_loopback_address(rdv))
    return {"127.0.0.1", "loopback rendezvous"};
  std::string source = route_source_address(rdv, request.rendezvous_port);
  if (!source.empty())
    return {source, "route to " + rdv};
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0')
    return {name, "host name (no route to " + rdv + ")"};
  return {"127.0.0.1", "no route to " + rdv};
}

}  // namespace ronde::detail
