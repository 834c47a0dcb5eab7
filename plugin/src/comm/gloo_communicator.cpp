// The CPU backend: a Communicator over the system Gloo. All Gloo calls live in
// the backend module (libronde_gloo.so), which does not link LibTorch and is
// opened with RTLD_DEEPBIND, so they cannot bind to the Gloo copy that
// LibTorch's wheel exports. This file loads the module, checks where its Gloo
// came from, and adapts tensors and the c10d store to its C interface.
#include "comm/communicator.h"
#include "comm/gloo_module/error_buffer.h"
#include "comm/gloo_module/gloo_module_api.h"
#include "comm/host_types.h"
#include "runtime/error_text.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ronde::detail {
namespace {

constexpr const char* kModuleName = "libronde_gloo.so";

struct GlooModule {
  int (*abi_version)();
  const char* (*library_path)();
  int (*connect)(
      const RondeGlooStore*,
      int,
      int,
      const char*,
      int64_t,
      int,
      RondeGlooComm**,
      char*,
      size_t);
  void (*destroy)(RondeGlooComm*);
  void (*interrupt)(RondeGlooComm*);
  int (*allreduce)(RondeGlooComm*, void*, size_t, int, int, char*, size_t);
  int (*allgatherv)(
      RondeGlooComm*, const void*, size_t, void*, const size_t*, char*, size_t);
  int (*broadcast)(RondeGlooComm*, void*, size_t, int, char*, size_t);
  int (*alltoallv)(
      RondeGlooComm*,
      const void*,
      const int64_t*,
      void*,
      const int64_t*,
      char*,
      size_t);
  int (*barrier)(RondeGlooComm*, char*, size_t);
  std::string path;
};

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The module sits next to libronde, in the build tree and once installed.
std::string default_module_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&default_module_path), &info) != 0 &&
      info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    auto slash = self.rfind('/');
    if (slash != std::string::npos) {
      std::string candidate = self.substr(0, slash + 1) + kModuleName;
      if (file_exists(candidate))
        return candidate;
    }
  }
  return kModuleName;  // fall back to the loader's search path
}

bool deepbind_enabled(const GlooModuleConfig& config) {
  if (config.deepbind)
    return *config.deepbind;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers refuse RTLD_DEEPBIND; sanitizer builds keep LibTorch's
  // Gloo out by link order instead (see CONTRIBUTING.md).
  return false;
#else
  return true;
#endif
}

// gloo::allreduce(gloo::AllreduceOptions const&), as both copies export it.
constexpr const char* kGlooAllreduce =
    "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE";

std::string symbol_file(void* sym) {
  Dl_info info{};
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  return info.dli_fname;
}

template <typename F>
void bind_symbol(
    void* handle, const std::string& path, const char* name, F*& out) {
  out = reinterpret_cast<F*>(dlsym(handle, name));
  TORCH_CHECK(
      out != nullptr,
      "ronde: the Gloo backend module ",
      path,
      " lacks the symbol ",
      name,
      " (built from another ronde?)");
}

const GlooModule& load_module(const GlooModuleConfig& config) {
  static GlooModule module;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [&config] {
    // The one case no dlopen flag can repair: the executable itself loaded
    // the system libgloo after LibTorch, so libgloo's own internal calls
    // were already bound to LibTorch's exported copy of Gloo at start-up.
    if (void* global = dlopen("libgloo.so.0", RTLD_NOW | RTLD_NOLOAD)) {
      std::string winner = symbol_file(dlsym(RTLD_DEFAULT, kGlooAllreduce));
      dlclose(global);
      if (winner.find("libtorch") != std::string::npos) {
        failure =
            "ronde: this process loaded the system libgloo after LibTorch, "
            "so libgloo's own calls resolve into LibTorch's private copy of "
            "Gloo ('" +
            winner +
            "') and would crash. Do not link libgloo "
            "into the executable (ronde loads it in isolation), or link it "
            "before LibTorch.";
        return;
      }
    }
    std::string path =
        config.path.empty() ? default_module_path() : config.path;
    int flags = RTLD_NOW | RTLD_LOCAL;
    if (deepbind_enabled(config))
      flags |= RTLD_DEEPBIND;
    // Never closed: Gloo keeps threads and thread-locals alive for the life
    // of the process.
    void* handle = dlopen(path.c_str(), flags);
    if (handle == nullptr) {
      const char* e = dlerror();
      failure = "ronde: cannot load the Gloo backend module '" + path +
                "': " + (e ? e : "unknown error") +
                " (set RONDE_GLOO_MODULE to its path)";
      return;
    }
    module.path = path;
    bind_symbol(handle, path, "ronde_gloo_abi_version", module.abi_version);
    bind_symbol(handle, path, "ronde_gloo_library_path", module.library_path);
    bind_symbol(handle, path, "ronde_gloo_connect", module.connect);
    bind_symbol(handle, path, "ronde_gloo_destroy", module.destroy);
    bind_symbol(handle, path, "ronde_gloo_interrupt", module.interrupt);
    bind_symbol(handle, path, "ronde_gloo_allreduce", module.allreduce);
    bind_symbol(handle, path, "ronde_gloo_allgatherv", module.allgatherv);
    bind_symbol(handle, path, "ronde_gloo_broadcast", module.broadcast);
    bind_symbol(handle, path, "ronde_gloo_alltoallv", module.alltoallv);
    bind_symbol(handle, path, "ronde_gloo_barrier", module.barrier);
    if (module.abi_version() != RONDE_GLOO_ABI_VERSION) {
      failure = "ronde: the Gloo backend module '" + path +
                "' speaks interface version " +
                std::to_string(module.abi_version()) + ", this libronde " +
                std::to_string(RONDE_GLOO_ABI_VERSION);
      return;
    }
    // The start-up check the clash calls for: Gloo entry points that resolve
    // into LibTorch would run LibTorch's private Gloo and crash.
    std::string gloo_lib = module.library_path();
    if (gloo_lib.find("libtorch") != std::string::npos ||
        gloo_lib.find("gloo") == std::string::npos) {
      failure =
          "ronde: the Gloo backend module's gloo::allreduce resolves to '" +
          gloo_lib +
          "', not to the system libgloo: LibTorch's private Gloo copy "
          "would be used and crash. Load the module with RTLD_DEEPBIND "
          "(unset RONDE_GLOO_DEEPBIND) or link libgloo before LibTorch.";
      return;
    }
    // RTLD_DEEPBIND binds the module to the C++ runtime among its own
    // dependencies; the rest of the process may bind to another copy, one
    // that a library or the program linked statically and exports. The two
    // then disagree about libstdc++'s internal state and Gloo crashes (its
    // std::call_once jumps to a null pointer; a std::locale is freed by the
    // wrong copy): refuse instead. The probes are symbols that only a copy
    // of libstdc++ defines (unlike operator new, which allocators replace).
    for (const char* probe :
         {"__once_proxy", "_ZNSt6localeC1Ev", "_ZNSt6localeD1Ev"}) {
      void* mine = dlsym(handle, probe);
      void* theirs = dlsym(RTLD_DEFAULT, probe);
      if (mine == nullptr || theirs == nullptr || mine == theirs)
        continue;
      Dl_info a{}, b{};
      dladdr(mine, &a);
      dladdr(theirs, &b);
      failure = std::string(
                    "ronde: the Gloo backend module uses the C++ runtime "
                    "(libstdc++) in '") +
                (a.dli_fname ? a.dli_fname : "?") +
                "', but this process uses the copy in '" +
                (b.dli_fname ? b.dli_fname : "?") +
                "': that object carries a static libstdc++ and exports it, "
                "and Gloo would crash between the two. Link it with "
                "-Wl,--exclude-libs,ALL (or against the shared libstdc++).";
      return;
    }
  });
  TORCH_CHECK(failure.empty(), failure);
  return module;
}

// Store callbacks: the module rendezvouses through libronde's c10d store.
struct StoreBridge {
  c10::intrusive_ptr<c10d::Store> store;
  std::string prefix;
};

int store_set(
    void* self,
    const char* key,
    const char* data,
    size_t len,
    char* err,
    size_t err_len) {
  auto* b = static_cast<StoreBridge*>(self);
  try {
    b->store->set(b->prefix + key, std::vector<uint8_t>(data, data + len));
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, std::string("store set: ") + error_text(e));
    return 1;
  }
}

int store_get(
    void* self,
    const char* key,
    char** data,
    size_t* len,
    char* err,
    size_t err_len) {
  auto* b = static_cast<StoreBridge*>(self);
  try {
    auto v = b->store->get(b->prefix + key);
    *data = static_cast<char*>(std::malloc(v.empty() ? 1 : v.size()));
    if (*data == nullptr)
      throw std::bad_alloc();
    std::memcpy(*data, v.data(), v.size());
    *len = v.size();
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, std::string("store get: ") + error_text(e));
    return 1;
  }
}

int store_wait(
    void* self,
    const char* const* keys,
    size_t n,
    int64_t timeout_ms,
    char* err,
    size_t err_len) {
  auto* b = static_cast<StoreBridge*>(self);
  try {
    std::vector<std::string> ks;
    ks.reserve(n);
    for (size_t i = 0; i < n; ++i)
      ks.push_back(b->prefix + keys[i]);
    b->store->wait(ks, std::chrono::milliseconds(timeout_ms));
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, std::string("store wait: ") + error_text(e));
    return 1;
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(
      const GlooModule& module,
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::string& prefix,
      int rank,
      int size,
      const std::string& hostname,
      std::chrono::milliseconds timeout,
      int algorithm)
      : module_(module), bridge_{store, prefix}, rank_(rank), size_(size) {
    RondeGlooStore cb{&bridge_, &store_set, &store_get, &store_wait};
    char err[2048] = {0};
    int rc = module_.connect(
        &cb,
        rank,
        size,
        hostname.c_str(),
        timeout.count(),
        algorithm,
        &comm_,
        err,
        sizeof(err));
    if (rc != RONDE_GLOO_OK) {
      throw BackendFailure(CommError::Kind::Rendezvous, err);
    }
  }

  ~GlooCommunicator() override {
    abort();
  }

  const char* backend() const override {
    return "gloo";
  }
  int rank() const override {
    return rank_;
  }
  int size() const override {
    return size_;
  }

  void allreduce(const at::Tensor& tensor, BackendOp op) override {
    const int dtype = checked_host_dtype(tensor, "Gloo");
    at::Tensor h = host(tensor);
    check(module_.allreduce(
        live(),
        h.data_ptr(),
        h.numel(),
        dtype,
        host_op(op),
        err_,
        sizeof(err_)));
    copy_back(tensor, h);
  }

  void allgather(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<size_t>& bytes) override {
    at::Tensor hi = host(in);
    at::Tensor ho = host(out);
    check(module_.allgatherv(
        live(),
        hi.data_ptr(),
        hi.nbytes(),
        ho.data_ptr(),
        bytes.data(),
        err_,
        sizeof(err_)));
    copy_back(out, ho);
  }

  void broadcast(const at::Tensor& tensor, int root) override {
    at::Tensor h = host(tensor);
    check(module_.broadcast(
        live(), h.data_ptr(), h.nbytes(), root, err_, sizeof(err_)));
    copy_back(tensor, h);
  }

  void alltoall(
      const at::Tensor& in,
      const std::vector<int64_t>& send_bytes,
      const at::Tensor& out,
      const std::vector<int64_t>& recv_bytes) override {
    at::Tensor hi = host(in);
    at::Tensor ho = host(out);
    check(module_.alltoallv(
        live(),
        hi.data_ptr(),
        send_bytes.data(),
        ho.data_ptr(),
        recv_bytes.data(),
        err_,
        sizeof(err_)));
    copy_back(out, ho);
  }

  void barrier() override {
    check(module_.barrier(live(), err_, sizeof(err_)));
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (comm_ != nullptr) {
      module_.destroy(comm_);
      comm_ = nullptr;
    }
  }

  void interrupt() override {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (comm_ != nullptr) {
      module_.interrupt(comm_);
    }
  }

 private:
  RondeGlooComm* live() {
    if (comm_ == nullptr) {
      throw BackendFailure(
          CommError::Kind::Broken, "the Gloo communicator was aborted");
    }
    return comm_;
  }

  void check(int rc) {
    switch (rc) {
      case RONDE_GLOO_OK:
        return;
      case RONDE_GLOO_TIMEOUT:
        throw BackendFailure(CommError::Kind::Timeout, err_);
      case RONDE_GLOO_INVALID:
        TORCH_CHECK(false, "ronde: Gloo rejected the call: ", err_);
      default:
        throw BackendFailure(CommError::Kind::PeerFailure, err_);
    }
  }

  const GlooModule& module_;
  StoreBridge bridge_;
  int rank_;
  int size_;
  RondeGlooComm* comm_ = nullptr;
  // abort() (communication thread) against interrupt() (stall inspector).
  std::mutex abort_mutex_;
  char err_[2048] = {0};
};

}  // namespace

void load_gloo_backend(const GlooModuleConfig& config) {
  load_module(config);
}

std::unique_ptr<Communicator> make_gloo_communicator(
    const CommConfig& config, const CommGroup& group) {
  // The one check of the algorithm's name: it comes from InitOptions as
  // well as from RONDE_GLOO_ALGORITHM.
  const std::string& algorithm = config.gloo_tuning.algorithm;
  TORCH_CHECK(
      algorithm == "ring" || algorithm == "bcube",
      "ronde: unknown Gloo all-reduce algorithm '",
      algorithm,
      "': expected 'ring' or 'bcube'");
  const GlooModule& module = load_module(config.gloo);
  return std::make_unique<GlooCommunicator>(
      module,
      config.store,
      group.prefix,
      group.rank,
      group.size,
      config.hostname,
      config.timeout,
      algorithm == "bcube" ? RONDE_GLOO_BCUBE : RONDE_GLOO_RING);
}

}  // namespace ronde::detail
