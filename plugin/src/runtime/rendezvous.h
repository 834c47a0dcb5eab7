// Meeting the other ranks: the job's key-value store (a c10d::TCPStore hosted
// by rank 0, or by the launcher), the check that every process belongs to
// this job, the address a rank advertises, and the failure notices through
// which a rank that saw a collective fail learns which peers are gone.
#pragma once

#include "runtime/auth.h"
#include "runtime/launch_env.h"
#include "runtime/net_address.h"
#include "runtime/records.h"
#include "runtime/settings.h"
#include "runtime/topology.h"

#include <ronde/errors.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace ronde::detail {

// This job's keys in the store: "ronde/<job id>/<suffix>".
std::string job_key(const LaunchInfo& info, const std::string& suffix);

// At shutdown(), where rank 0 hosts the store: every other rank says it is
// done with the store, and then waits until rank 0's server has closed
// its connection (wait_until_closed_by_server()); rank 0 waits until all
// have said so (within `timeout`), and then destroys the store. So a rank
// that calls init() again at once cannot meet the last world's server,
// which rank 0 is about to destroy, instead of the next one's.
void leave_store(
    c10d::Store& store,
    const LaunchInfo& info,
    std::chrono::milliseconds timeout);

// A rendezvous failure naming the job and the store's address.
CommError rendezvous_error(const LaunchInfo& info, const std::string& msg);

// The job key of this process (runtime/auth.h), from the secret file the
// options or RONDE_JOB_SECRET_FILE name; nullopt when neither does. The
// file is read once per process (a later init() may find it gone: ronderun
// hands ranks on other hosts /dev/fd/3, a file already removed); a bad file
// throws CommError of kind Rendezvous.
std::optional<Key32> load_job_key(
    const LaunchInfo& info, const std::string& secret_file);

// A connection to the job's store, no more: rank 0 of a job whose launcher
// hosts none serves it (not a joining process). Throws what TCPStore
// throws.
c10::intrusive_ptr<c10d::Store> connect_store(
    const LaunchInfo& info,
    const Settings& settings,
    std::chrono::milliseconds timeout);

// Connects to (rank 0: hosts) the store and checks that the store belongs to
// this job and that no other process claimed this rank. With a job key,
// rank 0 publishes a fresh challenge in a record tagged with that key, each
// other rank checks the tag before it writes anything, and the store
// returned seals and checks every value (runtime/signed_store.h): a rank's
// first sealed value (its peer record) is its answer to the challenge, and
// every rank checks every other's. A process refused here (another job, no
// secret, another secret) says why and counts itself under ronde/refused,
// which rank 0 reports (refused_count). Throws CommError of kind
// Rendezvous. `connection`, when given: the connection to reuse when it
// holds one (an elastic job's later epochs; on rank 0 of a job without a
// hosted store it is the server, which must outlive every epoch), else
// where the new one is kept.
c10::intrusive_ptr<c10d::Store> join_store(
    const LaunchInfo& info,
    const Settings& settings,
    std::chrono::milliseconds timeout,
    const std::optional<Key32>& job_key,
    c10::intrusive_ptr<c10d::Store>* connection = nullptr);

// How many processes were refused at this store so far (see join_store);
// -1 when the store cannot be reached.
int64_t refused_count(c10d::Store& store);

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

// Every rank's PeerInfo, in rank order, exchanged through the store.
std::vector<PeerInfo> exchange_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    const PeerInfo& mine,
    std::chrono::milliseconds timeout);

// Whether the ranks are on more than one host.
bool spans_hosts(const std::vector<PeerInfo>& peers);

// Fails (the same CommError on every rank) when the job spans hosts and a
// rank advertises a loopback address, which the other hosts cannot reach:
// the message names every such rank, where its address came from, and the
// variables that fix it.
void check_reachable(
    const std::vector<PeerInfo>& peers, const LaunchInfo& info);

// One warning line (rank 0) when the launcher's local/cross ranks and sizes
// disagree with the topology the host identities show; empty when they
// agree or no launcher gave them.
std::string topology_disagreement(const std::vector<PeerInfo>& peers);

// After a collective failed here: posts this rank's failure notice, waits a
// short grace for every peer's, and returns the ranks whose notice did not
// come (dead, or stuck elsewhere), among the job ranks `among` (a process
// set's; empty: every rank). Ranks this one saw exit (`exited`), or that a
// peer's notice names as exited, are suspects at once: nobody waits out the
// grace for them. When the store cannot be asked, `lost` (if given) gets a
// sentence for the failure's message, and the suspects are a guess: {0}
// where rank 0 hosts the store (it is the one gone), every other rank of
// `among` where the store outlives the ranks (ronderun --min-np, torchrun's
// agent): then it is this rank that is cut off, from the store and from
// its peers alike. Every store call here ends within `timeout`
// (connect_store bounds the connection).
std::vector<int> failed_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    std::chrono::milliseconds timeout,
    const std::vector<int>& among = {},
    const std::vector<int>& exited = {},
    std::string* lost = nullptr);

}  // namespace ronde::detail
