// ronde's Gloo backend module: every Gloo call ronde makes happens here, on raw
// buffers. The module links the system Gloo and not LibTorch, and libronde
// opens it with RTLD_DEEPBIND so its Gloo references never bind to the copy
// of Gloo that LibTorch's wheel exports.
#include "error_buffer.h"
#include "gloo_module_api.h"
#include "reduce_kernels.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#define RONDE_GLOO_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using ronde::detail::write_error;

// Raised when a store callback fails; carries libronde's message through
// Gloo's rendezvous code.
struct StoreError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Adapts libronde's callbacks (a c10d::TCPStore behind them) to Gloo's store.
class CallbackStore : public gloo::rendezvous::Store {
 public:
  CallbackStore(const RondeGlooStore& cb, std::chrono::milliseconds timeout)
      : cb_(cb), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    char err[1024] = {0};
    if (cb_.set(
            cb_.self,
            key.c_str(),
            data.data(),
            data.size(),
            err,
            sizeof(err)) != 0) {
      throw StoreError(err);
    }
  }

  std::vector<char> get(const std::string& key) override {
    char err[1024] = {0};
    char* data = nullptr;
    size_t len = 0;
    if (cb_.get(cb_.self, key.c_str(), &data, &len, err, sizeof(err)) != 0) {
      throw StoreError(err);
    }
    std::vector<char> out(data, data + len);
    std::free(data);
    return out;
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
  }

  void wait(
      const std::vector<std::string>& keys,
      const std::chrono::milliseconds& timeout) override {
    std::vector<const char*> ptrs;
    ptrs.reserve(keys.size());
    for (const auto& k : keys) {
      ptrs.push_back(k.c_str());
    }
    char err[1024] = {0};
    if (cb_.wait(
            cb_.self,
            ptrs.data(),
            ptrs.size(),
            timeout.count(),
            err,
            sizeof(err)) != 0) {
      throw StoreError(err);
    }
  }

 private:
  RondeGlooStore cb_;
  std::chrono::milliseconds timeout_;
};

// Runs one Gloo call and turns whatever it throws into a status code and a
// message: nothing may unwind through the C interface.
template <typename F>
int guarded(const char* what, char* err, size_t err_len, F&& fn) {
  try {
    fn();
    return RONDE_GLOO_OK;
  } catch (const gloo::IoException& e) {
    std::string msg = e.what();
    bool timeout = msg.find("Timed out") != std::string::npos ||
                   msg.find("timed out") != std::string::npos;
    write_error(err, err_len, std::string(what) + ": " + msg);
    return timeout ? RONDE_GLOO_TIMEOUT : RONDE_GLOO_IO_ERROR;
  } catch (const StoreError& e) {
    write_error(err, err_len, std::string(what) + ": " + e.what());
    return RONDE_GLOO_IO_ERROR;
  } catch (const gloo::InvalidOperationException& e) {
    write_error(err, err_len, std::string(what) + ": " + e.what());
    return RONDE_GLOO_INVALID;
  } catch (const std::exception& e) {
    write_error(err, err_len, std::string(what) + ": " + e.what());
    return RONDE_GLOO_INTERNAL;
  } catch (...) {
    write_error(err, err_len, std::string(what) + ": unknown exception");
    return RONDE_GLOO_INTERNAL;
  }
}

}  // namespace

struct RondeGlooComm {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  gloo::AllreduceOptions::Algorithm algorithm;
  // Gloo matches messages by tag; one call runs at a time per communicator,
  // so a counter keeps consecutive collectives apart.
  uint32_t next_tag = 1;
  uint32_t tag() {
    return next_tag++;
  }
};

RONDE_GLOO_EXPORT int ronde_gloo_abi_version(void) {
  return RONDE_GLOO_ABI_VERSION;
}

RONDE_GLOO_EXPORT const char* ronde_gloo_library_path(void) {
  static std::string path = [] {
    Dl_info info{};
    void (*fn)(const gloo::AllreduceOptions&) = &gloo::allreduce;
    if (dladdr(reinterpret_cast<void*>(fn), &info) == 0 ||
        info.dli_fname == nullptr) {
      return std::string("<unknown>");
    }
    return std::string(info.dli_fname);
  }();
  return path.c_str();
}

RONDE_GLOO_EXPORT int ronde_gloo_connect(
    const RondeGlooStore* store,
    int rank,
    int size,
    const char* hostname,
    int64_t timeout_ms,
    int algorithm,
    RondeGlooComm** out,
    char* err,
    size_t err_len) {
  if (store == nullptr || out == nullptr || rank < 0 || rank >= size) {
    write_error(err, err_len, "ronde_gloo_connect: invalid arguments");
    return RONDE_GLOO_INVALID;
  }
  auto comm = std::make_unique<RondeGlooComm>();
  comm->algorithm = algorithm == RONDE_GLOO_BCUBE
                        ? gloo::AllreduceOptions::Algorithm::BCUBE
                        : gloo::AllreduceOptions::Algorithm::RING;
  std::chrono::milliseconds timeout(timeout_ms);
  int rc = guarded("gloo rendezvous", err, err_len, [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname != nullptr ? hostname : "127.0.0.1";
    comm->device = gloo::transport::tcp::CreateDevice(attr);
    comm->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    comm->context->setTimeout(timeout);
    CallbackStore cb_store(*store, timeout);
    comm->context->connectFullMesh(cb_store, comm->device);
  });
  if (rc == RONDE_GLOO_OK) {
    *out = comm.release();
  }
  return rc;
}

namespace {

// Closes every connection: peers blocked on this rank fail at once instead
// of at their timeout. (A collective blocked here is woken only when a peer
// closes its side.)
void close_pairs(RondeGlooComm* comm) {
  if (comm == nullptr || !comm->context)
    return;
  for (int i = 0; i < comm->context->size; ++i) {
    if (i == comm->context->rank)
      continue;
    try {
      auto& pair = comm->context->getPair(i);
      if (!pair)
        continue;
      pair->close();
    } catch (...) {
      // A pair that already failed may refuse; it is closed either way.
    }
  }
}

}  // namespace

RONDE_GLOO_EXPORT void ronde_gloo_interrupt(RondeGlooComm* comm) {
  close_pairs(comm);
}

RONDE_GLOO_EXPORT void ronde_gloo_destroy(RondeGlooComm* comm) {
  if (comm == nullptr)
    return;
  // Close every connection first, explicitly: peers blocked on this rank
  // then fail at once instead of at their timeout, even while something
  // else still holds a reference to the context.
  close_pairs(comm);
  try {
    delete comm;
  } catch (...) {
    // Closing sockets of a broken mesh may throw; nothing left to report to.
  }
}

RONDE_GLOO_EXPORT int ronde_gloo_allreduce(
    RondeGlooComm* comm,
    void* buf,
    size_t count,
    int dtype,
    int op,
    char* err,
    size_t err_len) {
  ReduceFn fn = pick_reduce(dtype, op);
  size_t esize = element_size(dtype);
  if (comm == nullptr || fn == nullptr || esize == 0) {
    write_error(err, err_len, "allreduce: unsupported dtype or reduce op");
    return RONDE_GLOO_INVALID;
  }
  if (count == 0 || comm->context->size == 1) {
    return RONDE_GLOO_OK;
  }
  return guarded("allreduce", err, err_len, [&] {
    gloo::AllreduceOptions opts(comm->context);
    opts.setAlgorithm(comm->algorithm);
    switch (esize) {
      case 1:
        opts.setOutput(static_cast<uint8_t*>(buf), count);
        break;
      case 2:
        opts.setOutput(static_cast<uint16_t*>(buf), count);
        break;
      case 4:
        opts.setOutput(static_cast<uint32_t*>(buf), count);
        break;
      default:
        opts.setOutput(static_cast<uint64_t*>(buf), count);
        break;
    }
    opts.setReduceFunction(fn);
    opts.setTag(comm->tag());
    gloo::allreduce(opts);
  });
}

RONDE_GLOO_EXPORT int ronde_gloo_allgatherv(
    RondeGlooComm* comm,
    const void* in,
    size_t in_bytes,
    void* out,
    const size_t* counts,
    char* err,
    size_t err_len) {
  if (comm == nullptr || counts == nullptr) {
    write_error(err, err_len, "allgatherv: invalid arguments");
    return RONDE_GLOO_INVALID;
  }
  const int size = comm->context->size;
  std::vector<size_t> elements(counts, counts + size);
  size_t total = 0;
  for (size_t c : elements)
    total += c;
  if (elements[comm->context->rank] != in_bytes) {
    write_error(
        err, err_len, "allgatherv: counts[rank] differs from input size");
    return RONDE_GLOO_INVALID;
  }
  if (size == 1 || total == 0) {
    if (in_bytes > 0 && in != out)
      std::memmove(out, in, in_bytes);
    return RONDE_GLOO_OK;
  }
  return guarded("allgather", err, err_len, [&] {
    gloo::AllgathervOptions opts(comm->context);
    // Gloo takes a non-const input pointer but only reads it.
    opts.setInput(
        const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), in_bytes);
    opts.setOutput(static_cast<uint8_t*>(out), elements);
    opts.setTag(comm->tag());
    gloo::allgatherv(opts);
  });
}

RONDE_GLOO_EXPORT int ronde_gloo_broadcast(
    RondeGlooComm* comm,
    void* buf,
    size_t bytes,
    int root,
    char* err,
    size_t err_len) {
  if (comm == nullptr || root < 0 || root >= comm->context->size) {
    write_error(err, err_len, "broadcast: invalid root");
    return RONDE_GLOO_INVALID;
  }
  if (bytes == 0 || comm->context->size == 1) {
    return RONDE_GLOO_OK;
  }
  return guarded("broadcast", err, err_len, [&] {
    gloo::BroadcastOptions opts(comm->context);
    opts.setOutput(static_cast<uint8_t*>(buf), bytes);
    opts.setRoot(root);
    opts.setTag(comm->tag());
    gloo::broadcast(opts);
  });
}

RONDE_GLOO_EXPORT int ronde_gloo_alltoallv(
    RondeGlooComm* comm,
    const void* in,
    const int64_t* send_bytes,
    void* out,
    const int64_t* recv_bytes,
    char* err,
    size_t err_len) {
  if (comm == nullptr || send_bytes == nullptr || recv_bytes == nullptr) {
    write_error(err, err_len, "alltoallv: invalid arguments");
    return RONDE_GLOO_INVALID;
  }
  const int size = comm->context->size;
  std::vector<int64_t> send(send_bytes, send_bytes + size);
  std::vector<int64_t> recv(recv_bytes, recv_bytes + size);
  int64_t send_total = 0, recv_total = 0;
  for (int r = 0; r < size; ++r) {
    send_total += send[r];
    recv_total += recv[r];
  }
  if (size == 1) {
    if (send_total > 0)
      std::memmove(out, in, static_cast<size_t>(send_total));
    return RONDE_GLOO_OK;
  }
  // Gloo cannot make an unbound buffer of zero bytes; a one-byte scratch keeps
  // empty exchanges valid without touching user memory.
  static thread_local uint8_t scratch[2];
  void* in_ptr = send_total > 0 ? const_cast<void*>(in) : &scratch[0];
  void* out_ptr = recv_total > 0 ? out : &scratch[1];
  return guarded("alltoall", err, err_len, [&] {
    gloo::AlltoallvOptions opts(comm->context);
    opts.setInput(static_cast<uint8_t*>(in_ptr), send);
    opts.setOutput(static_cast<uint8_t*>(out_ptr), recv);
    opts.setTag(comm->tag());
    gloo::alltoallv(opts);
  });
}

RONDE_GLOO_EXPORT int ronde_gloo_barrier(
    RondeGlooComm* comm, char* err, size_t err_len) {
  if (comm == nullptr) {
    write_error(err, err_len, "barrier: invalid arguments");
    return RONDE_GLOO_INVALID;
  }
  if (comm->context->size == 1) {
    return RONDE_GLOO_OK;
  }
  return guarded("barrier", err, err_len, [&] {
    gloo::BarrierOptions opts(comm->context);
    opts.setTag(comm->tag());
    gloo::barrier(opts);
  });
}
