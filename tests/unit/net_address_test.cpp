// The advertised address (interface filters, routes, the order of the
// choices) and the topology derived from host identities.
#include "runtime/net_address.h"
#include "runtime/topology.h"

#include <gtest/gtest.h>

namespace ronde::detail {
namespace {

const std::vector<NetInterface> kInterfaces = {
    {"lo", "127.0.0.1", false, true},
    {"docker0", "172.17.0.1", false, false},
    {"eth0", "198.18.0.7", false, false},
    {"eth0", "fd00::7", true, false},
    {"ib0", "10.1.0.7", false, false},
};

TEST(IfnameFilter, ReadsPrefixesExclusionsAndExactNames) {
  IfnameFilter f = parse_ifname_filter("eth,ib", false);
  EXPECT_TRUE(f.matches("eth0"));
  EXPECT_TRUE(f.matches("ib1"));
  EXPECT_FALSE(f.matches("docker0"));
  f = parse_ifname_filter("^docker,lo", false);
  EXPECT_FALSE(f.matches("docker0"));
  EXPECT_FALSE(f.matches("lo"));
  EXPECT_TRUE(f.matches("eth0"));
  f = parse_ifname_filter("=eth0", false);
  EXPECT_TRUE(f.matches("eth0"));
  EXPECT_FALSE(f.matches("eth01"));
  f = parse_ifname_filter("eth", /*exact=*/true);  // GLOO_SOCKET_IFNAME
  EXPECT_FALSE(f.matches("eth0"));
  EXPECT_TRUE(f.matches("eth"));
}

TEST(IfnameFilter, PicksTheFirstMatchingAddressOfTheWantedFamily) {
  EXPECT_EQ(
      filtered_address(kInterfaces, parse_ifname_filter("eth", false), false),
      "198.18.0.7");
  EXPECT_EQ(
      filtered_address(kInterfaces, parse_ifname_filter("eth", false), true),
      "fd00::7");
  EXPECT_EQ(
      filtered_address(kInterfaces, parse_ifname_filter("ib", false), true),
      "10.1.0.7");  // no IPv6 there: the other family
  // An exclusion list never picks loopback.
  EXPECT_EQ(
      filtered_address(
          kInterfaces, parse_ifname_filter("^docker", false), false),
      "198.18.0.7");
  // Naming loopback picks it.
  EXPECT_EQ(
      filtered_address(kInterfaces, parse_ifname_filter("lo", false), false),
      "127.0.0.1");
  EXPECT_EQ(
      filtered_address(kInterfaces, parse_ifname_filter("wlan", false), false),
      std::nullopt);
}

TEST(Loopback, RecognisesEveryLoopbackForm) {
  for (const char* a :
       {"127.0.0.1", "127.0.1.1", "::1", "localhost", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(is_loopback_address(a)) << a;
  }
  for (const char* a :
       {"198.18.0.1", "10.0.0.1", "fd00::1", "h0", "", "128.0.0.1"}) {
    EXPECT_FALSE(is_loopback_address(a)) << a;
  }
}

TEST(ChooseAddress, FollowsTheDocumentedOrder) {
  AddressRequest r;
  r.rendezvous_addr = "198.18.0.1";
  r.rendezvous_port = 29500;
  r.option = "10.9.9.9";
  r.hostname = "10.8.8.8";
  r.ifname = "ib";
  r.ifname_variable = "RONDE_SOCKET_IFNAME";
  EXPECT_EQ(choose_address(r, kInterfaces).address, "10.9.9.9");
  EXPECT_EQ(choose_address(r, kInterfaces).source, "InitOptions::hostname");
  r.option.clear();
  EXPECT_EQ(choose_address(r, kInterfaces).address, "10.8.8.8");
  EXPECT_EQ(choose_address(r, kInterfaces).source, "RONDE_HOSTNAME");
  r.hostname.clear();
  AddressChoice c = choose_address(r, kInterfaces);
  EXPECT_EQ(c.address, "10.1.0.7");
  EXPECT_EQ(c.source, "RONDE_SOCKET_IFNAME=ib");
  r.ifname = "eth0";
  r.ifname_variable = "GLOO_SOCKET_IFNAME";
  EXPECT_EQ(choose_address(r, kInterfaces).address, "198.18.0.7");
  r.ifname = "wlan0";
  try {
    choose_address(r, kInterfaces);
    FAIL() << "no interface matches";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("GLOO_SOCKET_IFNAME=wlan0"),
        std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("eth0 198.18.0.7"), std::string::npos)
        << e.what();
  }
  r.ifname.clear();
  r.rendezvous_addr = "127.0.0.1";
  EXPECT_EQ(choose_address(r, kInterfaces).address, "127.0.0.1");
  EXPECT_EQ(choose_address(r, kInterfaces).source, "loopback rendezvous");
}

TEST(ChooseAddress, TakesTheRouteToTheRendezvous) {
  // Every machine routes 127.0.0.2 through lo, from 127.0.0.1: the route
  // lookup itself, with no interface of a test network needed.
  EXPECT_EQ(route_source_address("127.0.0.2", 9), "127.0.0.1");
  EXPECT_EQ(route_source_address("no-such-host.invalid", 9), "");
  AddressRequest r;
  r.rendezvous_addr = "127.0.1.1";  // a name's loopback address, numerically
  // Numerically loopback: the loopback job's rule applies.
  EXPECT_EQ(choose_address(r, {}).source, "loopback rendezvous");
}

TEST(Topology, DerivesLocalAndCrossPlacesFromHostIdentities) {
  // Ranks 0, 2 on host A; 1, 3 on host B (launchers may interleave).
  std::vector<std::string> hosts = {"A", "B", "A", "B"};
  Topology t = derive_topology(hosts, 3);
  EXPECT_EQ(t.hosts, 2);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_EQ(t.cross_rank, 1);
  EXPECT_EQ(t.cross_size, 2);
  EXPECT_TRUE(t.even());
  EXPECT_EQ(t.local_ranks(3), (std::vector<int>{1, 3}));
  EXPECT_EQ(t.cross_ranks(2), (std::vector<int>{2, 3}));
  // Uneven: A has 3 ranks, B 1. Local rank 2 exists on A only.
  hosts = {"A", "A", "A", "B"};
  t = derive_topology(hosts, 2);
  EXPECT_FALSE(t.even());
  EXPECT_EQ(t.local_rank, 2);
  EXPECT_EQ(t.cross_size, 1);
  EXPECT_EQ(t.cross_rank, 0);
  t = derive_topology(hosts, 3);
  EXPECT_EQ(t.local_rank, 0);
  EXPECT_EQ(t.local_size, 1);
  EXPECT_EQ(t.cross_rank, 1);
  EXPECT_EQ(t.cross_size, 2);
  // One host.
  t = derive_topology({"A", "A"}, 1);
  EXPECT_EQ(t.hosts, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_EQ(t.cross_size, 1);
}

}  // namespace
}  // namespace ronde::detail
