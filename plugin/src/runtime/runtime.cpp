// init() and shutdown(): read the launcher's environment, meet the other
// ranks through a c10d::TCPStore hosted by rank 0 (checking that they belong
// to this job), connect the communicator and start the communication thread.
#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/runtime.h>
#include <ronde/timeline.h>

#include "runtime/error_text.h"
#include "runtime/runtime_state.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <mutex>

namespace ronde {
namespace detail {
namespace {

std::mutex g_init_mutex;
// Deliberately never destroyed at exit: a job that forgot shutdown() must not
// tear down sockets and threads during static destruction.
Runtime* g_runtime = nullptr;

constexpr double kDefaultTimeoutSeconds = 30.0;

double resolve_timeout(const InitOptions& options) {
  if (options.timeout_seconds() > 0)
    return options.timeout_seconds();
  TORCH_CHECK(
      options.timeout_seconds() == 0,
      "ronde: InitOptions::timeout_seconds must be positive, got ",
      options.timeout_seconds());
  if (auto t = positive_env_number("RONDE_TIMEOUT_SECONDS", "seconds")) {
    return *t;
  }
  return kDefaultTimeoutSeconds;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v ? std::string(v) : fallback;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

std::string resolve_hostname(
    const InitOptions& options, const LaunchInfo& info) {
  if (!options.hostname().empty())
    return options.hostname();
  std::string h = env_or("RONDE_HOSTNAME", "");
  if (!h.empty())
    return h;
  if (is_loopback(info.addr))
    return "127.0.0.1";
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    return name;
  }
  return "127.0.0.1";
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

// Rank 0 publishes the job's identity; every other rank reads it before it
// writes anything, so a process of another job (or with another world size)
// leaves without touching this job's keys.
void check_identity(Runtime& rt) {
  const LaunchInfo& info = rt.info;
  const std::string identity = info.job_id + "|" + std::to_string(info.size);
  if (info.rank == 0) {
    rt.store->set(
        "ronde/identity",
        std::vector<uint8_t>(identity.begin(), identity.end()));
  } else {
    auto v = rt.store->get("ronde/identity");
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
      rt.store->add(rt.key("rank/" + std::to_string(info.rank)), 1);
  if (claims != 1) {
    throw rendezvous_error(
        info,
        "rank " + std::to_string(info.rank) +
            " was claimed by another process "
            "already (two processes with the same "
            "rank?)");
  }
}

void connect(Runtime& rt, const InitOptions& options) {
  const LaunchInfo& info = rt.info;
  CommConfig config;
  config.rank = info.rank;
  config.size = info.size;
  config.timeout = rt.timeout;
  config.prefix = rt.key("");
  load_backends(info.size);
  if (info.size == 1) {
    rt.comm = make_communicator(config);
    return;
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(info.port);
  so.isServer = info.rank == 0 && !info.store_hosted;
  so.numWorkers = std::nullopt;
  so.waitWorkers = false;
  so.timeout = rt.timeout;
  // PyTorch's switch for the store server's event loop: USE_LIBUV=0 picks
  // the older, thread-based server (for systems where libuv misbehaves).
  so.useLibUV = env_or("USE_LIBUV", "1") != "0";
  try {
    rt.store = c10::make_intrusive<c10d::TCPStore>(info.addr, so);
    check_identity(rt);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw rendezvous_error(
        info,
        std::string("cannot reach the rendezvous "
                    "store: ") +
            error_text(e));
  }
  config.store = rt.store;
  config.hostname = resolve_hostname(options, info);
  config.host_algorithm = options.gloo_algorithm().empty()
                              ? env_or("RONDE_GLOO_ALGORITHM", "ring")
                              : options.gloo_algorithm();
  try {
    rt.comm = make_communicator(config);
  } catch (const BackendFailure& e) {
    throw rendezvous_error(info, error_text(e));
  }
}

}  // namespace

Runtime& runtime(const char* caller) {
  TORCH_CHECK(
      g_runtime != nullptr, "ronde::", caller, "() needs ronde::init() first");
  return *g_runtime;
}

}  // namespace detail

void init(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(detail::g_init_mutex);
  if (detail::g_runtime != nullptr)
    return;
  auto rt = std::make_unique<detail::Runtime>();
  rt->info = detail::parse_launch_env(detail::process_env());
  rt->timeout = std::chrono::milliseconds(
      static_cast<int64_t>(detail::resolve_timeout(options) * 1000.0));
  detail::connect(*rt, options);
  rt->worker = std::make_unique<detail::CommWorker>(*rt->comm);
  if (rt->info.size > 1) {
    rt->inspector = std::make_unique<detail::StallInspector>(
        *rt, detail::stall_options_from_env());
  }
  detail::g_runtime = rt.release();
  if (const char* path = std::getenv("RONDE_TIMELINE"); path && *path) {
    start_timeline(path);
  }
}

void shutdown() {
  std::lock_guard<std::mutex> lock(detail::g_init_mutex);
  if (detail::g_runtime == nullptr)
    return;
  std::unique_ptr<detail::Runtime> rt(detail::g_runtime);
  // The last barrier keeps rank 0's store and every connection alive until
  // all ranks are done with them. A broken job skips it with a warning.
  if (rt->info.size > 1) {
    try {
      rt->worker
          ->submit(
              [](detail::Communicator& c, detail::HandleState&) {
                c.barrier();
              },
              /*run_inline=*/false,
              "barrier at shutdown")
          .wait();
    } catch (const std::exception& e) {
      std::cerr << "ronde: warning: rank " << rt->info.rank
                << " could not meet the other ranks at shutdown: "
                << detail::error_text(e) << std::endl;
    }
  }
  rt->inspector.reset();
  rt->worker.reset();
  rt->comm.reset();
  rt->store.reset();
  detail::g_runtime = nullptr;
  stop_timeline();
}

bool is_initialized() {
  return detail::g_runtime != nullptr;
}

int rank() {
  return detail::runtime("rank").info.rank;
}
int size() {
  return detail::runtime("size").info.size;
}
int local_rank() {
  return detail::runtime("local_rank").info.local_rank;
}
int local_size() {
  return detail::runtime("local_size").info.local_size;
}
int cross_rank() {
  return detail::runtime("cross_rank").info.cross_rank;
}
int cross_size() {
  return detail::runtime("cross_size").info.cross_size;
}
std::string job_id() {
  return detail::runtime("job_id").info.job_id;
}
double timeout_seconds() {
  return detail::runtime("timeout_seconds").timeout.count() / 1000.0;
}

c10::Device device() {
  int lr = detail::runtime("device").info.local_rank;
  if (at::hasCUDA()) {
    int n = at::detail::getCUDAHooks().deviceCount();
    if (n > 0) {
      return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(lr % n));
    }
  }
  return c10::Device(c10::kCPU);
}

}  // namespace ronde
