// The store, the job's identity check, the advertised address and the
// failure notices.
#include "runtime/rendezvous.h"

#include "runtime/error_text.h"
#include "runtime/launch_contract.h"
#include "runtime/signed_store.h"
#include "runtime/store_socket.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace ronde::detail {
namespace {

constexpr const char* kIdentityKey = "ronde/identity";

// Where rank 0 publishes the identity: outside any job's prefix at the
// first meeting (another job's process reads it there and leaves), within
// the epoch's keys afterwards (the store is known to be this job's, and a
// later epoch's challenge must not be confused with an earlier one's).
std::string identity_key(const LaunchInfo& info) {
  return info.epoch == 0 && info.incarnation == 0 ? std::string(kIdentityKey)
                                                  : job_key(info, "identity");
}
// Outside any job's prefix: a process of another job counts itself here.
constexpr const char* kRefusedKey = "ronde/refused";
constexpr size_t kChallengeBytes = 32;
// How long a rank re-reads an identity record of another job before it
// refuses (the record may be stale, its job's rank 0 about to replace it).
constexpr int kStaleIdentityMs = 3000;

// Counts a refused process for rank 0's report, then returns the error to
// throw. Best effort: the store may be gone.
CommError refuse(
    c10d::Store& store, const LaunchInfo& info, const std::string& why) {
  try {
    store.add(kRefusedKey, 1);
  } catch (const std::exception&) {
  }
  return rendezvous_error(info, "refused: " + why);
}

// Rank 0 publishes the job's identity (and, with a secret, the challenge);
// every other rank reads and checks it before it writes anything, so a
// process of another job (or with another world size, or without this
// job's secret) leaves without touching this job's keys. Returns the run
// key when the job is authenticated.
std::optional<Key32> check_identity(
    c10d::Store& store,
    const LaunchInfo& info,
    const std::optional<Key32>& secret_key) {
  std::optional<Key32> run;
  if (info.rank == 0) {
    const std::string challenge =
        secret_key ? random_bytes(kChallengeBytes) : std::string();
    const std::string identity = encode_identity(
        info.job_id, info.size, secret_key ? &*secret_key : nullptr, challenge);
    store.set(
        identity_key(info),
        std::vector<uint8_t>(identity.begin(), identity.end()));
    if (secret_key)
      run = run_key(*secret_key, challenge);
  } else {
    auto read = [&] {
      auto v = store.get(identity_key(info));
      return decode_identity(std::string(v.begin(), v.end()));
    };
    IdentityRecord theirs = read();
    // The record may be the last attempt's, in a store that outlives its
    // ranks (torchrun's agent, after a restart): give this job's rank 0 a
    // moment to write its own before refusing.
    const auto patience = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(kStaleIdentityMs);
    while ((theirs.job_id != info.job_id ||
            theirs.size != std::to_string(info.size)) &&
           std::chrono::steady_clock::now() < patience) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      theirs = read();
    }
    const std::string me =
        "this process (rank " + std::to_string(info.rank) + ")";
    if (theirs.job_id != info.job_id ||
        theirs.size != std::to_string(info.size)) {
      throw refuse(
          store,
          info,
          "the store there belongs to job '" + theirs.job_id + "' of " +
              theirs.size + " ranks, but " + me + " was started for job '" +
              info.job_id + "' of " + std::to_string(info.size) + " ranks");
    }
    if (theirs.authenticated && !secret_key) {
      throw refuse(
          store,
          info,
          "job '" + info.job_id + "' is authenticated, and " + me +
              " has no job secret: start it with the job's secret "
              "(RONDE_JOB_SECRET_FILE, or ronderun, which hands its ranks "
              "one)");
    }
    if (!theirs.authenticated && secret_key) {
      throw refuse(
          store,
          info,
          me + " has a job secret, but the job at the store is not "
               "authenticated (its rank 0 has no secret): not joining a "
               "job that cannot prove it knows the secret");
    }
    if (secret_key) {
      if (!identity_verifies(theirs, *secret_key)) {
        throw refuse(
            store,
            info,
            "job '" + info.job_id + "' does not prove the secret " + me +
                " has (its identity record's tag does not verify): another "
                "job's secret, or a forged record");
      }
      run = run_key(*secret_key, theirs.challenge);
    }
  }
  // Two processes started with the same rank would corrupt the mesh.
  int64_t claims =
      store.add(job_key(info, "rank/" + std::to_string(info.rank)), 1);
  if (claims != 1) {
    throw rendezvous_error(
        info,
        "rank " + std::to_string(info.rank) +
            " was claimed by another process "
            "already (two processes with the same "
            "rank?)");
  }
  return run;
}

}  // namespace

std::string job_key(const LaunchInfo& info, const std::string& suffix) {
  std::string key = "ronde/" + info.job_id + "/";
  if (info.incarnation > 0)
    key += "i" + std::to_string(info.incarnation) + "/";
  if (info.epoch > 0)
    key += "e" + std::to_string(info.epoch) + "/";
  return key + suffix;
}

void leave_store(
    c10d::Store& store,
    const LaunchInfo& info,
    std::chrono::milliseconds timeout) {
  const std::string left = job_key(info, "left");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    if (info.rank != 0) {
      store.add(left, 1);
      return;
    }
    while (store.add(left, 0) < info.size - 1 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } catch (const std::exception&) {
    // The store is gone already: nothing to keep in step.
  }
}

CommError rendezvous_error(const LaunchInfo& info, const std::string& msg) {
  return CommError(
      CommError::Kind::Rendezvous,
      "rendezvous",
      "",
      info.rank,
      {},
      "tcpstore",
      "job '" + info.job_id + "' at " + info.addr + ":" +
          std::to_string(info.port) + ": " + msg);
}

std::optional<Key32> load_job_key(
    const LaunchInfo& info, const std::string& secret_file) {
  if (secret_file.empty())
    return std::nullopt;
  // Read once: a later init() in this process may find the file gone.
  static std::mutex mutex;
  static std::map<std::string, std::string> secrets;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = secrets.find(secret_file);
  if (it == secrets.end()) {
    try {
      it = secrets
               .emplace(
                   secret_file,
                   read_private_file(
                       secret_file, "the job secret file", kMinJobSecretBytes))
               .first;
    } catch (const std::exception& e) {
      throw rendezvous_error(
          info, "rank " + std::to_string(info.rank) + ": " + e.what());
    }
  }
  return job_key_from_secret(it->second, info.job_id);
}

int64_t refused_count(c10d::Store& store) {
  try {
    return store.add(kRefusedKey, 0);
  } catch (const std::exception&) {
    return -1;
  }
}

c10::intrusive_ptr<c10d::Store> connect_store(
    const LaunchInfo& info,
    const Settings& settings,
    std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(info.port);
  so.isServer = info.rank == 0 && !info.store_hosted && info.join_member < 0;
  so.numWorkers = std::nullopt;
  so.waitWorkers = false;
  so.timeout = timeout;
  // PyTorch's switch for the store server's event loop: USE_LIBUV=0 picks
  // the older, thread-based server (for systems where libuv misbehaves).
  so.useLibUV = settings.use_libuv;
  const std::set<int> before = open_sockets();
  auto store = c10::make_intrusive<c10d::TCPStore>(info.addr, so);
  // Every later call on this connection ends within the job's timeout,
  // even when the store's host is cut off from this one.
  bound_store_connections(before, info.port, timeout);
  return store;
}

c10::intrusive_ptr<c10d::Store> join_store(
    const LaunchInfo& info,
    const Settings& settings,
    std::chrono::milliseconds timeout,
    const std::optional<Key32>& secret_key,
    c10::intrusive_ptr<c10d::Store>* connection) {
  try {
    c10::intrusive_ptr<c10d::Store> store;
    if (connection != nullptr && *connection) {
      store = *connection;
    } else {
      store = connect_store(info, settings, timeout);
      if (connection != nullptr)
        *connection = store;
    }
    if (auto run = check_identity(*store, info, secret_key))
      return c10::make_intrusive<SignedStore>(
          std::move(store), *run, info.rank);
    return store;
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw rendezvous_error(
        info,
        std::string("cannot reach the rendezvous store: ") + error_text(e));
  }
}

AddressChoice advertised_address(
    const std::string& requested,
    const Settings& settings,
    const LaunchInfo& info) {
  AddressRequest request;
  request.option = requested;
  request.hostname = settings.hostname;
  request.ifname = settings.socket_ifname;
  request.ifname_variable = settings.socket_ifname_variable;
  request.rendezvous_addr = info.addr;
  request.rendezvous_port = info.port;
  try {
    return choose_address(request, list_interfaces());
  } catch (const std::exception& e) {
    throw rendezvous_error(
        info, "rank " + std::to_string(info.rank) + ": " + e.what());
  }
}

std::vector<int> failed_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    std::chrono::milliseconds timeout,
    const std::vector<int>& among,
    const std::vector<int>& exited,
    std::string* lost) {
  const int me = info.rank;
  std::vector<int> peers = among;
  if (peers.empty()) {
    for (int r = 0; r < info.size; ++r)
      peers.push_back(r);
  }
  // The store could not be asked: say so, and guess who is gone.
  auto store_lost = [&](const std::exception& e) -> std::vector<int> {
    const std::string where =
        "the store at " + info.addr + ":" + std::to_string(info.port);
    if (!info.store_hosted) {
      if (lost != nullptr)
        *lost = "; " + where +
                " (hosted by rank 0) cannot be reached "
                "either (" +
                error_text(e) +
                "): rank 0 is gone, or cut off "
                "from this rank";
      return {0};
    }
    std::vector<int> others;
    std::string names;
    for (int r : peers) {
      if (r == me)
        continue;
      others.push_back(r);
      names += (names.empty() ? "" : ", ") + std::to_string(r);
    }
    if (lost != nullptr)
      *lost =
          "; rank " + std::to_string(me) + " lost contact with " + where +
          " (" + error_text(e) + ") and with ranks " + names +
          ": the store outlives every rank, so this host may be partitioned "
          "from the job's network";
    return others;
  };
  // The notice: "gone:" and the ranks this one saw exit.
  std::string notice = "gone:";
  for (size_t i = 0; i < exited.size(); ++i)
    notice += (i ? "," : "") + std::to_string(exited[i]);
  try {
    store.set(
        job_key(info, "failed/" + std::to_string(me)),
        std::vector<uint8_t>(notice.begin(), notice.end()));
  } catch (const std::exception& e) {
    return store_lost(e);
  }
  std::set<int> gone(exited.begin(), exited.end());
  // A notice counts once it opens: one that does not (forged, or replayed
  // from another run) leaves its rank among the suspects, said once.
  std::set<int> refused, read;
  auto has_notice = [&](int r) {
    if (read.count(r))
      return true;
    const std::string key = job_key(info, "failed/" + std::to_string(r));
    if (!store.check({key}))
      return false;
    try {
      const std::vector<uint8_t> value = store.get(key);
      const std::string text(value.begin(), value.end());
      if (text.rfind("gone:", 0) == 0) {
        std::stringstream list(text.substr(5));
        std::string item;
        while (std::getline(list, item, ',')) {
          char* end = nullptr;
          const long r = std::strtol(item.c_str(), &end, 10);
          if (!item.empty() && *end == '\0')
            gone.insert(static_cast<int>(r));
        }
      }
      read.insert(r);
      return true;
    } catch (const RefusedStoreValue& e) {
      if (refused.insert(r).second)
        std::cerr << "ronde: rank " << me
                  << ": ignoring a failure notice: " << e.what() << std::endl;
      return false;
    }
  };
  auto grace = std::min(timeout, std::chrono::milliseconds(3000));
  auto deadline = std::chrono::steady_clock::now() + grace;
  std::vector<int> missing;
  for (;;) {
    missing.clear();
    bool only_gone = true;
    try {
      for (int r : peers) {
        if (r != me && !has_notice(r)) {
          missing.push_back(r);
          only_gone = only_gone && gone.count(r) > 0;
        }
      }
    } catch (const std::exception& e) {
      return store_lost(e);
    }
    if (only_gone || std::chrono::steady_clock::now() >= deadline) {
      return missing;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string host_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  if (boot.empty()) {
    // No procfs: the host name is the best fact left.
    char name[256] = {0};
    ::gethostname(name, sizeof(name) - 1);
    boot = std::string("host:") + name;
  }
  struct stat net {};
  std::string ns =
      ::stat("/proc/self/ns/net", &net) == 0
          ? std::to_string(net.st_dev) + "." + std::to_string(net.st_ino)
          : "?";
  return boot + "/net:" + ns;
}

std::vector<PeerInfo> exchange_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    const PeerInfo& mine,
    std::chrono::milliseconds timeout) {
  const std::string text = encode_peer(mine);
  store.set(
      job_key(info, "peer/" + std::to_string(info.rank)),
      std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < info.size; ++r)
    keys.push_back(job_key(info, "peer/" + std::to_string(r)));
  store.wait(keys, timeout);
  std::vector<PeerInfo> peers;
  for (int r = 0; r < info.size; ++r) {
    auto v = store.get(keys[r]);
    peers.push_back(decode_peer(std::string(v.begin(), v.end()), r));
  }
  // Every rank has read every record before any acts on them: a verdict
  // that ends rank 0 (which hosts the store) must reach the others too.
  // Once this rank has the records, a store that goes away while it waits
  // means rank 0 saw every rank's count and left with that verdict: this
  // rank reaches the same one from what it read.
  const std::string read = job_key(info, "peers-read");
  store.add(read, 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    while (store.add(read, 0) < info.size) {
      if (std::chrono::steady_clock::now() >= deadline)
        break;  // the connection step after this one names who is missing
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  } catch (const std::exception&) {
  }
  return peers;
}

bool spans_hosts(const std::vector<PeerInfo>& peers) {
  for (const auto& p : peers) {
    if (p.host != peers.front().host)
      return true;
  }
  return false;
}

void check_reachable(
    const std::vector<PeerInfo>& peers, const LaunchInfo& info) {
  if (!spans_hosts(peers))
    return;
  std::string bad;
  for (size_t r = 0; r < peers.size(); ++r) {
    if (is_loopback_address(peers[r].address.address)) {
      bad += (bad.empty() ? "" : "; ") + std::string("rank ") +
             std::to_string(r) + " would advertise " +
             peers[r].address.address + " (from " + peers[r].address.source +
             ")";
    }
  }
  if (bad.empty())
    return;
  throw rendezvous_error(
      info,
      "the job spans hosts, but " + bad +
          ": ranks on other hosts cannot reach a loopback address. On that "
          "host set RONDE_SOCKET_IFNAME to the interface that reaches the "
          "other hosts (or RONDE_HOSTNAME to its address), or give "
          "MASTER_ADDR as an address every host routes to, not a name "
          "that resolves to loopback there");
}

std::string topology_disagreement(const std::vector<PeerInfo>& peers) {
  std::vector<std::string> hosts;
  for (const auto& p : peers)
    hosts.push_back(p.host);
  std::string diffs;
  int count = 0;
  for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
    const PeerInfo& p = peers[r];
    if (p.launcher == "none")
      continue;
    Topology t = derive_topology(hosts, r);
    if (t.local_rank == p.local_rank && t.local_size == p.local_size &&
        t.cross_rank == p.cross_rank && t.cross_size == p.cross_size) {
      continue;
    }
    if (++count <= 4) {
      auto four = [](int a, int b, int c, int d) {
        return std::to_string(a) + "/" + std::to_string(b) + "/" +
               std::to_string(c) + "/" + std::to_string(d);
      };
      diffs += (diffs.empty() ? "" : "; ") + std::string("rank ") +
               std::to_string(r) + " was told " +
               four(p.local_rank, p.local_size, p.cross_rank, p.cross_size) +
               " by " + p.launcher + ", observed " +
               four(t.local_rank, t.local_size, t.cross_rank, t.cross_size);
    }
  }
  if (count == 0)
    return "";
  if (count > 4)
    diffs += "; and " + std::to_string(count - 4) + " more";
  return "the launcher's local_rank/local_size/cross_rank/cross_size "
         "disagree with the hosts the ranks run on (" +
         diffs + "); using what was observed";
}

}  // namespace ronde::detail
