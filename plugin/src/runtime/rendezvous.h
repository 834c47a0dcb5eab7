// Meeting the other ranks: the job's key-value store (a c10d::TCPStore hosted
// by rank 0, or by the launcher), the check that every process belongs to
// this job, the address a rank advertises, and the failure notices through
// which a rank that saw a collective fail learns which peers are gone.
#pragma once

#include "runtime/launch_env.h"
#include "runtime/net_address.h"
#include "runtime/topology.h"
#include "runtime/settings.h"

#include <ronde/errors.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace ronde::detail {

// This job's keys in the store: "ronde/<job id>/<suffix>".
std::string job_key(const LaunchInfo& info, const std::string& suffix);

// A rendezvous failure naming the job and the store's address.
CommError rendezvous_error(const LaunchInfo& info, const std::string& msg);

// Connects to (rank 0: hosts) the store and checks that the store belongs to
// this job and that no other process claimed this rank. Throws CommError of
// kind Rendezvous.
c10::intrusive_ptr<c10d::Store> join_store(
    const LaunchInfo& info,
    const Settings& settings,
    std::chrono::milliseconds timeout);

// The address this rank's transport advertises (net_address.h says how it
// is chosen), and where it came from. Throws CommError of kind Rendezvous
// when an interface filter matches nothing.
AddressChoice advertised_address(
    const std::string& requested,
    const Settings& settings,
    const LaunchInfo& info);

// This process's host, as facts the kernel gives: the boot id (one per
// booted kernel, so one per machine or VM) and the network namespace.
// Ranks in different network namespaces are different hosts, even on one
// machine: that is how a cluster is simulated on one.
std::string host_identity();

// What each rank tells the others at init(): its host, the address it
// advertises and why, and where its launcher said it sits.
struct PeerInfo {
  std::string host;  // host_identity()
  AddressChoice address;
  int local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  std::string launcher;  // LaunchInfo::source
};

// Every rank's PeerInfo, in rank order, exchanged through the store.
std::vector<PeerInfo> exchange_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    const PeerInfo& mine,
    std::chrono::milliseconds timeout);

// Fails (the same CommError on every rank) when the job spans hosts and a
// rank advertises a loopback address, which the other hosts cannot reach:
// the message names every such rank, where its address came from, and the
// variables that fix it.
void check_reachable(const std::vector<PeerInfo>& peers, const LaunchInfo& info);

// One warning line (rank 0) when the launcher's local/cross ranks and sizes
// disagree with the topology the host identities show; empty when they
// agree or no launcher gave them.
std::string topology_disagreement(const std::vector<PeerInfo>& peers);

// After a collective failed here: posts this rank's failure notice, waits a
// short grace for every peer's, and returns the ranks whose notice did not
// come (dead, or stuck elsewhere), among the job ranks `among` (a process
// set's; empty: every rank). {0} when the store itself is gone (rank 0
// hosts it).
std::vector<int> failed_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    std::chrono::milliseconds timeout,
    const std::vector<int>& among = {});

}  // namespace ronde::detail
