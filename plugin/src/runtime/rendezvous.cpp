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

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

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

std::string advertised_address(
    const std::string& requested,
    const Settings& settings,
    const LaunchInfo& info) {
  if (!requested.empty())
    return requested;
  if (!settings.hostname.empty())
    return settings.hostname;
  if (is_loopback(info.addr))
    return "127.0.0.1";
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    return name;
  }
  return "127.0.0.1";
}

std::vector<int> failed_peers(
    c10d::Store& store,
    const LaunchInfo& info,
    std::chrono::milliseconds timeout) {
  const int me = info.rank;
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
      for (int r = 0; r < info.size; ++r) {
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

std::vector<std::string> exchange_host_identities(
    c10d::Store& store,
    const LaunchInfo& info,
    std::chrono::milliseconds timeout) {
  const std::string mine = host_identity();
  store.set(
      job_key(info, "host/" + std::to_string(info.rank)),
      std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < info.size; ++r)
    keys.push_back(job_key(info, "host/" + std::to_string(r)));
  store.wait(keys, timeout);
  std::vector<std::string> hosts;
  for (const auto& k : keys) {
    auto v = store.get(k);
    hosts.emplace_back(v.begin(), v.end());
  }
  return hosts;
}

}  // namespace ronde::detail
