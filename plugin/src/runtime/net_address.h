// Which address a rank advertises to its peers. By default it is the local
// address of the interface the kernel routes to the rendezvous address
// through: the address the rank's store connection uses, so it is one that
// the rendezvous host, and therefore the job's other hosts, can reach. An
// interface filter (RONDE_SOCKET_IFNAME, as NCCL_SOCKET_IFNAME; else
// GLOO_SOCKET_IFNAME) or an explicit address (RONDE_HOSTNAME) overrides it.
// No LibTorch here: unit tested on its own.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {

struct NetInterface {
  std::string name;     // "eth0"
  std::string address;  // numeric, "198.18.0.1" or "fd00::1"
  bool ipv6 = false;
  bool loopback = false;
};

// The interfaces that are up and carry an IPv4 or IPv6 address (link-local
// IPv6 addresses left out: they need a scope to be used), in the kernel's
// order.
std::vector<NetInterface> list_interfaces();

// An interface filter as NCCL_SOCKET_IFNAME reads it: a comma list of name
// prefixes ("eth,ib"); a leading '^' makes it a list of prefixes to exclude
// ("^docker,lo"); a leading '=' makes the names exact ("=eth0"). `exact`
// treats every name as exact (GLOO_SOCKET_IFNAME's reading).
struct IfnameFilter {
  std::vector<std::string> names;
  bool exclude = false;
  bool exact = false;
  bool matches(const std::string& ifname) const;
};
IfnameFilter parse_ifname_filter(const std::string& spec, bool exact);

// The address of the first interface that passes `filter`, preferring the
// address family of `want_ipv6`; nullopt when none does. Loopback
// interfaces pass only when the filter names them.
std::optional<std::string> filtered_address(
    const std::vector<NetInterface>& interfaces,
    const IfnameFilter& filter,
    bool want_ipv6);

// The local address the kernel would send from to reach host:port (a UDP
// socket connected there: no packet leaves); empty when `host` does not
// resolve or no route leads there.
std::string route_source_address(const std::string& host, int port);

// Whether `address` (a numeric address or "localhost") is a loopback one.
bool is_loopback_address(const std::string& address);

// Where a rank's advertised address came from, for messages.
struct AddressChoice {
  std::string address;
  // "InitOptions::hostname", "RONDE_HOSTNAME", "RONDE_SOCKET_IFNAME=eth",
  // "route to <rendezvous>", "loopback rendezvous".
  std::string source;
};

struct AddressRequest {
  std::string option;           // InitOptions::hostname
  std::string hostname;         // RONDE_HOSTNAME
  std::string ifname;           // RONDE_SOCKET_IFNAME or GLOO_SOCKET_IFNAME
  std::string ifname_variable;  // which of the two
  std::string rendezvous_addr;  // MASTER_ADDR / RONDE_RENDEZVOUS_ADDR
  int rendezvous_port = 0;
};

// The address to advertise, in this order: the option, RONDE_HOSTNAME, the
// interface filter, 127.0.0.1 for a rendezvous on loopback, the source
// address of the route to the rendezvous address, and last the host name.
// Throws std::runtime_error when the filter matches no interface (naming
// the variable and the interfaces there are).
AddressChoice choose_address(
    const AddressRequest& request, const std::vector<NetInterface>& interfaces);

}  // namespace ronde::detail
