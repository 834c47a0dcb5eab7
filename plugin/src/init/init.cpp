// init() and shutdown(): the composition root, the one file that sees both
// layers it wires together. It reads the settings and the launcher's
// environment (runtime/), meets the other ranks through the job's store
// (runtime/rendezvous), connects the communicator and starts the worker
// (comm/), and starts the stall inspector (runtime/) with hooks into them.
#include <ronde/errors.h>
#include <ronde/runtime.h>
#include <ronde/timeline.h>

#include "init/runtime.h"

#include "comm/world.h"
#include "runtime/cpu_binding.h"
#include "runtime/error_text.h"
#include "runtime/launch_env.h"
#include "runtime/rendezvous.h"
#include "runtime/settings.h"
#include "runtime/stall_inspector.h"
#include "runtime/store_socket.h"
#include "runtime/topology.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <csignal>
#include <iostream>
#include <limits>
#include <mutex>

namespace ronde {
namespace detail {

std::mutex g_init_mutex;
// Deliberately never destroyed at exit, like the World.
Runtime* g_runtime = nullptr;

namespace {

// Counts worlds connected (init() and changes of world): a process set
// made under one is not part of the next (World::epoch).
uint64_t g_epoch = 0;

Runtime& runtime(const char* caller) {
  TORCH_CHECK(
      g_runtime != nullptr, "ronde::", caller, "() needs ronde::init() first");
  return *g_runtime;
}

double resolve_timeout(const InitOptions& options, const Settings& s) {
  if (options.timeout_seconds() > 0)
    return options.timeout_seconds();
  TORCH_CHECK(
      options.timeout_seconds() == 0,
      "ronde: InitOptions::timeout_seconds must be positive, got ",
      options.timeout_seconds());
  return s.timeout_seconds.value_or(
      std::chrono::duration<double>(kDefaultTimeout).count());
}

// Step 1 of connect(): what the settings and options say about the
// communicators, before any rank is met.
CommConfig comm_config(
    const Runtime& rt, const InitOptions& options, const Settings& settings) {
  CommConfig config;
  config.timeout = rt.timeout;
  config.gloo = GlooModuleConfig{settings.gloo_module, settings.gloo_deepbind};
  config.cuda_backend = settings.cuda_backend;
  config.shm = ShmConfig{settings.shm, settings.shm_tuning};
  config.hierarchical = settings.hierarchical;
  config.gloo_tuning = settings.gloo_tuning;
  if (!options.gloo_algorithm().empty())
    config.gloo_tuning.algorithm = options.gloo_algorithm();
  return config;
}

// Step 2: joins (rank 0: hosts) the job's store, authenticated by the job
// secret when there is one.
std::optional<Key32> join_job_store(Runtime& rt, const Settings& settings) {
  std::optional<Key32> job_key =
      load_job_key(rt.info, job_secret_file(rt, settings));
  rt.job_key = job_key;
  rt.store = join_store(rt.info, settings, rt.timeout, job_key, &rt.connection);
  return job_key;
}

// Step 3: every rank's host facts; this rank's advertised address.
std::vector<PeerInfo> meet_peers(
    Runtime& rt,
    const InitOptions& options,
    const Settings& settings,
    PeerInfo& mine) {
  const LaunchInfo& info = rt.info;
  mine.host = host_identity();
  mine.address = advertised_address(options.hostname(), settings, info);
  mine.local_rank = info.local_rank;
  mine.local_size = info.local_size;
  mine.cross_rank = info.cross_rank;
  mine.cross_size = info.cross_size;
  // After a change of world the launcher's layout no longer describes the
  // job: nothing to compare with what the hosts show.
  mine.launcher = info.epoch == 0 ? info.source : "none";
  std::vector<PeerInfo> peers;
  try {
    peers = exchange_peers(*rt.store, info, mine, rt.timeout);
  } catch (const std::exception& e) {
    throw rendezvous_error(info, "exchanging host facts: " + error_text(e));
  }
  check_reachable(peers, info);
  return peers;
}

// Step 4: rank 0's warnings about what the peers showed: an unauthenticated
// job across hosts, a launcher whose layout the hosts contradict.
void warn_about_job(
    const LaunchInfo& info,
    const std::vector<PeerInfo>& peers,
    bool authenticated) {
  if (info.rank != 0)
    return;
  if (!authenticated && spans_hosts(peers)) {
    std::cerr << "ronde: warning: job '" << info.job_id
              << "' spans hosts and is not authenticated: any process "
                 "that reaches the rendezvous store at "
              << info.addr << ":" << info.port
              << " can write values the ranks trust. Give the ranks a "
                 "job secret (RONDE_JOB_SECRET_FILE; ronderun makes one): "
                 "see docs/security.md"
              << std::endl;
  }
  std::string disagreement = topology_disagreement(peers);
  if (!disagreement.empty())
    std::cerr << "ronde: warning: " << disagreement << std::endl;
}

// Step 5: where this rank sits is what the host identities show, whatever
// the launcher said.
void adopt_topology(LaunchInfo& info, const std::vector<std::string>& hosts) {
  const Topology topology = derive_topology(hosts, info.rank);
  info.local_rank = topology.local_rank;
  info.local_size = topology.local_size;
  info.cross_rank = topology.cross_rank;
  info.cross_size = topology.cross_size;
}

// Step 6: the global process set, its communicator and its worker.
std::shared_ptr<Group> connect_global(
    const LaunchInfo& info,
    const CommConfig& config,
    const CommGroup& group,
    bool blocking_wait) {
  std::vector<int> everyone(info.size);
  for (int r = 0; r < info.size; ++r)
    everyone[r] = r;
  auto global = std::make_shared<Group>(std::move(everyone));
  global->id = 0;
  global->rank = info.rank;
  global->size = info.size;
  try {
    global->comm = make_communicator(config, group);
  } catch (const BackendFailure& e) {
    throw rendezvous_error(info, error_text(e));
  }
  global->worker = std::make_unique<CommWorker>(*global->comm, blocking_wait);
  return global;
}

}  // namespace

std::unique_ptr<World> connect(
    Runtime& rt, const InitOptions& options, const Settings& settings) {
  const LaunchInfo& info = rt.info;
  CommConfig config = comm_config(rt, options, settings);
  CommGroup group;
  group.prefix = job_key(info, "");
  group.rank = info.rank;
  group.size = info.size;
  load_backends(config, group);
  auto w = std::make_unique<World>();
  w->rank = info.rank;
  w->size = info.size;
  w->blocking_wait = settings.blocking_wait;
  w->help_bytes =
      settings.help_bytes.value_or(std::numeric_limits<size_t>::max());
  if (info.size > 1) {
    const bool authenticated = join_job_store(rt, settings).has_value();
    config.store = rt.store;
    PeerInfo mine;
    const std::vector<PeerInfo> peers = meet_peers(rt, options, settings, mine);
    for (const auto& p : peers)
      group.hosts.push_back(p.host);
    warn_about_job(info, peers, authenticated);
    config.hostname = mine.address.address;
    adopt_topology(rt.info, group.hosts);
    // The store outlives the World: shutdown() destroys the World first.
    c10d::Store* store = rt.store.get();
    w->failed_peers = [store, info, timeout = rt.timeout](
                          const std::vector<int>& among,
                          const std::vector<int>& exited) {
      World::Suspects s;
      s.ranks = failed_peers(*store, info, timeout, among, exited, &s.note);
      return s;
    };
  }
  w->global = connect_global(info, config, group, settings.blocking_wait);
  w->config = std::move(config);
  w->group = std::move(group);
  return w;
}

void bring_up(Runtime& rt, const Settings& settings, std::unique_ptr<World> w) {
  w->epoch = ++g_epoch;
  if (rt.info.size > 1) {
    Group* g = w->global.get();  // destroyed after the inspector
    rt.inspector = std::make_unique<StallInspector>(
        rt.store,
        rt.info,
        stall_options(settings),
        StallWatch{
            [g] { return g->worker->progress(); },
            [g] { g->comm->interrupt(); }});
  }
  install_world(std::move(w));
}

std::string job_secret_file(const Runtime& rt, const Settings& settings) {
  return !rt.options.job_secret_file().empty() ? rt.options.job_secret_file()
                                               : settings.job_secret_file;
}

void barrier(World& w, const char* what) {
  w.global->worker
      ->submit(
          [](Communicator& c, HandleState&) { c.barrier(); },
          /*run_inline=*/false,
          what)
      .wait();
}

void release(Runtime& rt) {
  rt.store.reset();
  rt.elastic_store.reset();
  rt.connection.reset();
  clear_settings();
  stop_timeline();
}

namespace {

// Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that
// just died would end this process with SIGPIPE instead of raising a
// CommError. Ignored unless the program chose a disposition of its own
// (Python, for one, already ignores it).
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL && !(current.sa_flags & SA_SIGINFO)) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

}  // namespace

// init() under its lock, without the process sets. `given`: where this
// process sits, instead of the launcher's environment; `store`: the store to
// meet the other ranks in, instead of one init() connects to (both from a
// torch.distributed process group: attach_to_store()).
void init_locked(
    const InitOptions& options,
    const LaunchInfo* given = nullptr,
    c10::intrusive_ptr<c10d::Store> store = {});

void shutdown_job(bool restarting);

// Whether the running job's global communicator was broken by a failure
// (a peer died or was cut off). Under g_init_mutex.
bool job_broken() {
  if (g_runtime == nullptr)
    return false;
  World& w = world("init");
  return w.global && w.global->worker && w.global->worker->failed();
}

}  // namespace detail

void init(const InitOptions& options) {
  {
    std::unique_lock<std::mutex> lock(detail::g_init_mutex);
    if (detail::job_broken()) {
      // A job a failure broke starts anew, as shutdown() then init() would
      // (what Horovod's scripts do after a HorovodInternalError): the
      // other ranks meet this one in the next job once they do the same.
      std::cerr << "ronde: warning: rank " << detail::g_runtime->info.rank
                << ": init() on a job broken by an earlier failure starts "
                   "a new one"
                << std::endl;
      lock.unlock();
      detail::shutdown_job(/*restarting=*/true);
      lock.lock();
    }
    if (detail::g_runtime != nullptr)
      return;
    detail::init_locked(options);
  }
  // The sets asked for at init(), created in the order given, as
  // add_process_set() would; a failure leaves the job as before init().
  try {
    for (const ProcessSet& set : options.process_sets())
      add_process_set(set);
  } catch (...) {
    shutdown();
    throw;
  }
}

namespace detail {
void init_locked(
    const InitOptions& options,
    const LaunchInfo* given,
    c10::intrusive_ptr<c10d::Store> store) {
  const Settings settings = read_settings(process_env());
  auto rt = std::make_unique<Runtime>();
  rt->info = given != nullptr ? *given : parse_launch_env(process_env());
  static int inits = 0;  // under g_init_mutex
  rt->info.incarnation = inits++;
  rt->rank0_hosts_store = !store && !rt->info.store_hosted;
  rt->connection = std::move(store);
  rt->options = options;
  rt->member = rt->info.rank;
  if (rt->info.join_member >= 0) {
    // A world of one until the job admits it (elastic::join_world()).
    rt->member = rt->info.join_member;
    rt->joining = true;
  }
  for (int r = 0; r < rt->info.size; ++r)
    rt->members.push_back(r == rt->info.rank ? rt->member : r);
  rt->timeout = std::chrono::milliseconds(
      static_cast<int64_t>(resolve_timeout(options, settings) * 1000.0));
  if (rt->info.size > 1)
    ignore_sigpipe();
  // Before any thread of ronde's starts: they inherit the binding.
  const std::string unbound =
      bind_process(settings.bind_to, rt->info.local_rank, rt->info.local_size);
  if (!unbound.empty() && rt->info.local_rank == 0)
    std::cerr << "ronde: warning: rank " << rt->info.rank << ": " << unbound
              << std::endl;
  std::unique_ptr<detail::World> world =
      detail::connect(*rt, options, settings);
  detail::install_settings(settings);
  bring_up(*rt, settings, std::move(world));
  detail::g_runtime = rt.release();
  if (!settings.timeline.empty())
    start_timeline(settings.timeline);
}
bool attach_to_store(
    c10::intrusive_ptr<c10d::Store> store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& addr,
    int port) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (g_runtime != nullptr) {
    const LaunchInfo& info = g_runtime->info;
    TORCH_CHECK(
        info.rank == rank && info.size == size,
        "ronde: a ronde process group of ",
        size,
        " ranks, as rank ",
        rank,
        ", cannot join ronde's world, initialised with ",
        info.size,
        " ranks as rank ",
        info.rank,
        " (ronde.init() came first, with "
        "another launcher's values): give both the same ranks, or call "
        "ronde.shutdown() first");
    return false;
  }
  TORCH_CHECK(
      size >= 1 && rank >= 0 && rank < size,
      "ronde: a ronde process group needs 0 <= rank < size, got rank ",
      rank,
      " of ",
      size);
  TORCH_CHECK(
      timeout.count() > 0,
      "ronde: a ronde process group needs a positive timeout, got ",
      timeout.count(),
      " ms");
  LaunchInfo info;
  try {
    // The job id (and secret) a launcher gave, when it gave any.
    info.job_id = parse_launch_env(process_env()).job_id;
  } catch (const std::exception&) {
  }
  info.rank = rank;
  info.size = size;
  info.local_size = 1;
  info.addr = addr;
  info.port = port;
  info.source = "none";  // where it sits comes from the host identities
  InitOptions options;
  options.timeout_seconds(static_cast<double>(timeout.count()) / 1000.0);
  init_locked(options, &info, size > 1 ? std::move(store) : nullptr);
  return true;
}

}  // namespace detail

namespace detail {

// shutdown(); `restarting`: init() on a broken job, whose ranks are about
// to meet again at the same store address (see below).
void shutdown_job(bool restarting) {
  std::lock_guard<std::mutex> lock(detail::g_init_mutex);
  if (detail::g_runtime == nullptr)
    return;
  std::unique_ptr<detail::Runtime> rt(detail::g_runtime);
  detail::World& w = detail::world("shutdown");
  // Every added set finishes what it queued; the last barrier then keeps
  // rank 0's store and every connection alive until all ranks are done
  // with them. A broken job skips it with a warning.
  detail::stop_added_sets(w);
  bool met = false;
  if (rt->info.size > 1) {
    try {
      detail::barrier(w, "barrier at shutdown");
      met = true;
    } catch (const std::exception& e) {
      std::cerr << "ronde: warning: rank " << rt->info.rank
                << " could not meet the other ranks at shutdown: "
                << detail::error_text(e) << std::endl;
    }
  }
  rt->inspector.reset();
  detail::close_added_sets(w);
  // Drains the queue while the World is still installed (a failing job
  // looks it up to name suspects), then takes it down.
  w.global->worker.reset();
  detail::remove_world().reset();
  detail::g_runtime = nullptr;
  if (rt->rank0_hosts_store && rt->store) {
    // Leaving is for a job whose ranks all met: after a failure, waiting
    // for dead ranks to leave would only delay.
    if (met)
      detail::leave_store(*rt->store, rt->info, rt->timeout);
    // A rank that may meet the others again at this address (after a
    // clean shutdown, or restarting a broken job) first waits for rank 0
    // to take its store down (at once if rank 0 is gone): connecting
    // before then would meet that store.
    if ((met || restarting) && rt->info.rank != 0)
      detail::wait_until_closed_by_server(rt->info.port, rt->timeout);
  }
  detail::release(*rt);
}

}  // namespace detail

void shutdown() {
  detail::shutdown_job(/*restarting=*/false);
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

std::string host_backend() {
  detail::runtime("host_backend");
  return detail::world("host_backend").global->comm->backend();
}

bool nccl_built() {
  return detail::kNcclBuilt;
}

}  // namespace ronde
