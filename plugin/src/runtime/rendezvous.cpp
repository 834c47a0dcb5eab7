// The store, the job's identity check, the advertised address and the
// failure notices.
#include "runtime/rendezvous.h"

#include "runtime/error_text.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <thread>

namespace ronde::detail {
namespace {

// Rank 0 publishes the job's identity; every other rank reads it before it
// writes anything, so a process of another job (or with another world size)
// leaves without touching this job's keys.
void check_identity(c10d::Store& store, const LaunchInfo& info) {
  const std::string identity = info.job_id + "|" + std::to_string(info.size);
  if (info.rank == 0) {
    store.set(
        "ronde/identity",
        std::vector<uint8_t>(identity.begin(), identity.end()));
  } else {
    auto v = store.get("ronde/identity");
    std::string theirs(v.begin(), v.end());
    if (theirs != identity) {
      auto bar = theirs.rfind('|');
      std::string their_job = theirs.substr(0, bar);
      std::string their_size =
          bar == std::string::npos ? "?" : theirs.substr(bar + 1);
      throw rendezvous_error(
          info,
          "refused: the store there belongs to job '" + their_job + "' of " +
              their_size + " ranks, but this process (rank " +
              std::to_string(info.rank) + ") was started for job '" +
              info.job_id + "' of " + std::to_string(info.size) + " ranks");
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
}

}  // namespace

std::string job_key(const LaunchInfo& info, const std::string& suffix) {
  return "ronde/" + info.job_id + "/" + suffix;
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

c10::intrusive_ptr<c10d::Store> join_store(
    const LaunchInfo& info,
    const Settings& settings,
    std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(info.port);
  so.isServer = info.rank == 0 && !info.store_hosted;
  so.numWorkers = std::nullopt;
  so.waitWorkers = false;
  so.timeout = timeout;
  // PyTorch's switch for the store server's event loop: USE_LIBUV=0 picks
  // the older, thread-based server (for systems where libuv misbehaves).
  so.useLibUV = settings.use_libuv;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(info.addr, so);
    check_identity(*store, info);
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
    const std::vector<int>& among) {
  const int me = info.rank;
  std::vector<int> peers = among;
  if (peers.empty()) {
    for (int r = 0; r < info.size; ++r)
      peers.push_back(r);
  }
  try {
    store.set(
        job_key(info, "failed/" + std::to_string(me)),
        std::vector<uint8_t>{1});
  } catch (const std::exception&) {
    return {0};  // rank 0 hosts the store: it is the one gone
  }
  auto grace = std::min(timeout, std::chrono::milliseconds(3000));
  auto deadline = std::chrono::steady_clock::now() + grace;
  std::vector<int> missing;
  for (;;) {
    missing.clear();
    try {
      for (int r : peers) {
        if (r != me &&
            !store.check({job_key(info, "failed/" + std::to_string(r))})) {
          missing.push_back(r);
        }
      }
    } catch (const std::exception&) {
      return {0};
    }
    if (missing.empty() || std::chrono::steady_clock::now() >= deadline) {
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
  std::string ns = ::stat("/proc/self/ns/net", &net) == 0
      ? std::to_string(net.st_dev) + "." + std::to_string(net.st_ino)
      : "?";
  return boot + "/net:" + ns;
}

namespace {

// One line per field; no field holds a newline (identities and addresses
// are the kernel's and the resolver's, sources are ronde's own).
std::string encode(const PeerInfo& p) {
  return p.host + "\n" + p.address.address + "\n" + p.address.source + "\n" +
      std::to_string(p.local_rank) + "\n" + std::to_string(p.local_size) +
      "\n" + std::to_string(p.cross_rank) + "\n" +
      std::to_string(p.cross_size) + "\n" + p.launcher;
}

PeerInfo decode(const std::string& text, int rank) {
  std::vector<std::string> f;
  size_t start = 0;
  for (;;) {
    size_t nl = text.find('\n', start);
    f.push_back(text.substr(start, nl - start));
    if (nl == std::string::npos)
      break;
    start = nl + 1;
  }
  if (f.size() != 8) {
    throw std::runtime_error(
        "rank " + std::to_string(rank) +
        "'s rendezvous record is malformed (another ronde version?)");
  }
  PeerInfo p;
  p.host = f[0];
  p.address = {f[1], f[2]};
  p.local_rank = std::stoi(f[3]);
  p.local_size = std::stoi(f[4]);
  p.cross_rank = std::stoi(f[5]);
  p.cross_size = std::stoi(f[6]);
  p.launcher = f[7];
  return p;
}

}  // namespace

std::vector<PeerInfo> exchange_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    const PeerInfo& mine,
    std::chrono::milliseconds timeout) {
  const std::string text = encode(mine);
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
    peers.push_back(decode(std::string(v.begin(), v.end()), r));
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

void check_reachable(const std::vector<PeerInfo>& peers, const LaunchInfo& info) {
  bool one_host = true;
  for (const auto& p : peers)
    one_host = one_host && p.host == peers.front().host;
  if (one_host)
    return;
  std::string bad;
  for (size_t r = 0; r < peers.size(); ++r) {
    if (is_loopback_address(peers[r].address.address)) {
      bad += (bad.empty() ? "" : "; ") + std::string("rank ") +
          std::to_string(r) + " would advertise " + peers[r].address.address +
          " (from " + peers[r].address.source + ")";
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
