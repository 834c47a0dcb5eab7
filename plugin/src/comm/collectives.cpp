// The public collectives. Each call prepares its tensors on the caller's
// thread and queues a job on the communication thread. The job first
// exchanges a small descriptor with every rank (op, dtype, shape, root, name
// and any local error), so a mismatch fails on every rank with one message
// instead of hanging; then it runs the collective on the backend.
//
// Device tensors: at submit the caller's stream gets a "ready" event; the job
// runs its device work on the backend's stream (NCCL's own) or on a side
// stream (staging copies for Gloo), after that event, and ends with a "done"
// event that Handle::wait() orders the waiter's stream after. The caching
// allocator learns of every cross-stream use (record_stream), so no buffer is
// reused while the other stream may still touch it.
#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/timeline.h>

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "runtime/runtime_state.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace ronde {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Average:
      return "average";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Product:
      return "product";
  }
  return "unknown";
}

namespace detail {
namespace {

enum class OpKind : int32_t {
  Allreduce = 1,
  Allgather,
  Broadcast,
  Alltoall,
  Reducescatter,
  Barrier,
};

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::Allreduce:
      return "allreduce";
    case OpKind::Allgather:
      return "allgather";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::Alltoall:
      return "alltoall";
    case OpKind::Reducescatter:
      return "reducescatter";
    case OpKind::Barrier:
      return "barrier";
  }
  return "unknown";
}

constexpr uint32_t kMagic = 0x524f4e44;  // "ROND"
constexpr int kMaxDims = 16;

// Fixed-size and trivially copyable: it travels as raw bytes.
struct Descriptor {
  uint32_t magic = kMagic;
  int32_t kind = 0;
  int32_t dtype = -1;  // at::ScalarType, -1 for none
  int32_t op = -1;     // ReduceOp, -1 for none
  int32_t root = -1;
  int32_t ndim = -1;
  int64_t dims[kMaxDims] = {0};
  // The backend serving the tensor when it is not the job's host backend
  // (a CUDA tensor on NCCL); empty otherwise.
  char backend[16] = {0};
  char name[128] = {0};
  char error[200] = {0};  // this rank's own complaint about its input
};
static_assert(std::is_trivially_copyable_v<Descriptor>);

void copy_text(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

std::string shape_text(const Descriptor& d, bool skip_dim0) {
  if (d.ndim < 0)
    return "<undefined>";
  std::ostringstream os;
  os << c10::toString(static_cast<at::ScalarType>(d.dtype)) << "[";
  for (int i = 0; i < d.ndim; ++i) {
    os << (i ? ", " : "");
    if (i == 0 && skip_dim0) {
      os << "*";
    } else {
      os << d.dims[i];
    }
  }
  os << "]";
  return os.str();
}

// What must agree across ranks for this op, as text: ranks are grouped by it.
std::string signature(const Descriptor& d) {
  auto kind = static_cast<OpKind>(d.kind);
  std::ostringstream os;
  os << to_string(kind);
  if (d.op >= 0)
    os << "(" << to_string(static_cast<ReduceOp>(d.op)) << ")";
  if (d.root >= 0)
    os << "(root " << d.root << ")";
  if (kind != OpKind::Barrier) {
    bool ragged = kind == OpKind::Allgather || kind == OpKind::Alltoall;
    os << " " << shape_text(d, ragged);
  }
  if (d.name[0] != '\0')
    os << " '" << d.name << "'";
  if (d.backend[0] != '\0')
    os << " on " << d.backend;
  return os.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < ranks.size(); ++i)
    os << (i ? ", " : "") << ranks[i];
  return os.str();
}

struct Call {
  OpKind kind;
  std::string name;
  bool verify = true;
  Descriptor desc;
  // The input, when it lives on a device: its device and the caller's
  // stream there decide how the job orders its work (see the top).
  at::Tensor anchor;
};

Descriptor describe(
    OpKind kind,
    const at::Tensor& t,
    const std::string& name,
    int op,
    int root,
    std::string& error) {
  Descriptor d;
  d.kind = static_cast<int32_t>(kind);
  d.op = op;
  d.root = root;
  copy_text(d.name, sizeof(d.name), name);
  if (t.defined() && !t.is_cpu()) {
    Communicator& comm = *runtime(to_string(kind)).comm;
    const std::string via = comm.backend_for(t);
    if (via != comm.backend())
      copy_text(d.backend, sizeof(d.backend), via);
  }
  if (kind != OpKind::Barrier) {
    if (!t.defined()) {
      error = "the tensor is undefined";
    } else {
      d.dtype = static_cast<int32_t>(t.scalar_type());
      d.ndim = static_cast<int32_t>(t.dim());
      if (t.dim() > kMaxDims) {
        error = "tensors of more than 16 dimensions are not supported";
        d.ndim = kMaxDims;
      }
      for (int i = 0; i < d.ndim; ++i)
        d.dims[i] = t.size(i);
    }
  }
  copy_text(d.error, sizeof(d.error), error);
  return d;
}

// Exchanges descriptors and throws the same c10::Error on every rank if
// they disagree or any rank reported a problem with its input.
std::vector<Descriptor> exchange(Communicator& comm, const Descriptor& mine) {
  const int n = comm.size();
  std::vector<Descriptor> all(n);
  auto in = at::from_blob(
      const_cast<Descriptor*>(&mine), {sizeof(Descriptor)}, at::kByte);
  auto out = at::from_blob(
      all.data(), {static_cast<int64_t>(n * sizeof(Descriptor))}, at::kByte);
  comm.allgather(in, out, std::vector<size_t>(n, sizeof(Descriptor)));

  std::map<std::string, std::vector<int>> groups;
  for (int r = 0; r < n; ++r) {
    TORCH_INTERNAL_ASSERT(
        all[r].magic == kMagic,
        "ronde: corrupt collective descriptor from rank ",
        r);
    groups[signature(all[r])].push_back(r);
  }
  const std::string what = to_string(static_cast<OpKind>(mine.kind));
  if (groups.size() > 1) {
    std::ostringstream os;
    os << "ronde: ranks disagree on a collective (seen on rank " << comm.rank()
       << "): ";
    bool first = true;
    // Order by lowest rank so every rank prints the same message.
    std::vector<std::pair<int, std::string>> ordered;
    for (auto& [sig, ranks] : groups) {
      ordered.emplace_back(ranks.front(), rank_list(ranks) + " called " + sig);
    }
    std::sort(ordered.begin(), ordered.end());
    for (auto& [_, text] : ordered) {
      os << (first ? "" : "; ") << text;
      first = false;
    }
    TORCH_CHECK(false, os.str());
  }
  std::ostringstream errors;
  for (int r = 0; r < n; ++r) {
    if (all[r].error[0] != '\0') {
      errors << (errors.tellp() > 0 ? "; " : "") << "rank " << r << ": "
             << all[r].error;
    }
  }
  TORCH_CHECK(
      errors.tellp() == 0,
      "ronde: ",
      what,
      mine.name[0] ? std::string(" of '") + mine.name + "'" : "",
      " rejected: ",
      errors.str());
  return all;
}

// Ranks that have not confirmed the failure after a short grace period are
// named as suspects: dead, or stuck elsewhere.
std::vector<int> diagnose_suspects(Runtime& rt) {
  if (!rt.store || rt.info.size == 1)
    return {};
  const int me = rt.info.rank;
  try {
    rt.store->set(
        rt.key("failed/" + std::to_string(me)), std::vector<uint8_t>{1});
  } catch (const std::exception&) {
    return {0};  // rank 0 hosts the store: it is the one gone
  }
  auto grace = std::min(rt.timeout, std::chrono::milliseconds(3000));
  auto deadline = std::chrono::steady_clock::now() + grace;
  std::vector<int> missing;
  for (;;) {
    missing.clear();
    try {
      for (int r = 0; r < rt.info.size; ++r) {
        if (r != me &&
            !rt.store->check({rt.key("failed/" + std::to_string(r))})) {
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

// Runs the backend part of a job; a peer or network failure aborts the
// communicator (so peers blocked on us fail fast too) and becomes CommError.
template <typename F>
void guarded(Communicator& comm, const Call& call, F&& fn) {
  try {
    fn();
  } catch (const BackendFailure& e) {
    comm.abort();
    Runtime& rt = runtime("collective");
    throw CommError(
        e.kind,
        to_string(call.kind),
        call.name,
        rt.info.rank,
        diagnose_suspects(rt),
        comm.backend(),
        e.what());
  }
}

bool is_floating(const at::Tensor& t) {
  return t.defined() && at::isFloatingType(t.scalar_type());
}

std::string check_dtype(const at::Tensor& t) {
  if (!t.defined())
    return "";
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kShort:
    case at::kInt:
    case at::kLong:
      return "";
    default:
      return std::string("dtype ") + c10::toString(t.scalar_type()) +
             " is not supported (floating types and integers are)";
  }
}

std::string check_reduction(
    const at::Tensor& t, ReduceOp op, double pre, double post) {
  std::string e = check_dtype(t);
  if (!e.empty() || !t.defined())
    return e;
  if (!is_floating(t)) {
    if (op == ReduceOp::Average) {
      return "an average of integer tensors is not defined; use "
             "ReduceOp::Sum";
    }
    if (pre != 1.0 || post != 1.0) {
      return "prescale/postscale factors need a floating-point tensor";
    }
  }
  return "";
}

using Body = std::function<void(
    Communicator&, HandleState&, const std::vector<Descriptor>&, const Call&)>;

// Queues the job; it exchanges descriptors first when the call asks for it
// and hands them to the body (empty when not exchanged).
// Set by the blocking wrappers: the caller is about to wait anyway, so the
// job may run on its thread (see CommWorker::submit).
thread_local bool t_blocking_call = false;

struct BlockingCall {
  BlockingCall() {
    t_blocking_call = true;
  }
  ~BlockingCall() {
    t_blocking_call = false;
  }
};

// Stream order between the caller and the job, for a call on device tensors.
struct Fence {
  c10::Stream caller;  // the submitting thread's current stream
  c10::Event ready;    // recorded on it at submit
};

// The stream a host backend's staging copies run on, one per device. Only
// the job that holds the communicator (one at a time) touches it.
c10::Stream side_stream(c10::Device device) {
  static std::unordered_map<c10::Device, c10::Stream> streams;
  auto it = streams.find(device);
  if (it == streams.end()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    it = streams
             .emplace(
                 device,
                 impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true))
             .first;
  }
  return it->second;
}

// `uses` are tensors made on the caller's side that the job reads or
// writes: on a device they are marked as used by the job's stream too.
Handle submit(Call call, Body body, std::vector<at::Tensor> uses = {}) {
  const bool blocking = t_blocking_call;
  t_blocking_call = false;
  Runtime& rt = runtime(to_string(call.kind));
  if (!call.verify && call.desc.error[0] != '\0') {
    // Without the exchange the other ranks cannot learn of it; fail here.
    TORCH_CHECK(
        false,
        "ronde: ",
        to_string(call.kind),
        " on rank ",
        rt.info.rank,
        ": ",
        call.desc.error);
  }
  const int64_t submitted_us = timeline_enabled() ? timeline_now_us() : -1;
  const OpKind what_kind = call.kind;
  const std::string what_name = call.name;
  const std::string what =
      what_name.empty()
          ? std::string(to_string(what_kind))
          : std::string(to_string(what_kind)) + " '" + what_name + "'";
  std::shared_ptr<Fence> fence;
  if (call.anchor.defined()) {
    const c10::Device device = call.anchor.device();
    c10::impl::VirtualGuardImpl impl(device.type());
    fence = std::make_shared<Fence>(
        Fence{impl.getStream(device), c10::Event(device.type())});
    fence->ready.record(fence->caller);
  }
  return rt.worker->submit(
      [call = std::move(call),
       body = std::move(body),
       uses = std::move(uses),
       fence,
       what,
       submitted_us](Communicator& comm, HandleState& state) {
        const int64_t start_us = submitted_us >= 0 ? timeline_now_us() : -1;
        // The exchange first (host memory only): ranks that disagree, on
        // the backend too, learn it before a device backend connects.
        std::vector<Descriptor> all;
        if (call.verify) {
          guarded(comm, call, [&] { all = exchange(comm, call.desc); });
        }
        std::optional<c10::Stream> exec;
        if (fence) {
          guarded(comm, call, [&] { exec = comm.stream_for(call.anchor); });
          if (!exec)
            exec = side_stream(call.anchor.device());
          fence->ready.block(*exec);
        }
        c10::OptionalStreamGuard on_exec(exec);
        body(comm, state, all, call);
        if (fence) {
          for (const auto& t : uses) {
            if (t.defined() && !t.is_cpu())
              t.record_stream(*exec);
          }
          // Made on the job's stream, handed to the caller's.
          if (state.result.defined() && !state.result.is_cpu())
            state.result.record_stream(fence->caller);
          c10::Event done(exec->device_type());
          done.record(*exec);
          state.device = std::make_shared<DeviceWork>(std::move(done), what);
          comm.watch(call.anchor, state.device);
        }
        if (start_us >= 0) {
          int64_t bytes = 0;
          if (call.desc.dtype >= 0 && call.desc.ndim >= 0) {
            bytes = static_cast<int64_t>(c10::elementSize(
                static_cast<c10::ScalarType>(call.desc.dtype)));
            for (int d = 0; d < call.desc.ndim && d < kMaxDims; ++d) {
              bytes *= call.desc.dims[d];
            }
          }
          timeline_span(
              std::string(to_string(call.kind)) + " " + call.name,
              "collective",
              start_us,
              timeline_now_us(),
              "\"bytes\":" + std::to_string(bytes) +
                  ",\"queued_us\":" + std::to_string(start_us - submitted_us) +
                  ",\"verified\":" + (call.verify ? "true" : "false"));
        }
      },
      blocking,
      what);
}

// Reduction shared by allreduce and reducescatter: scale, reduce, average.
void reduce_in_place(
    Communicator& comm,
    const Call& call,
    const at::Tensor& work,
    ReduceOp op,
    double pre,
    double post) {
  if (pre != 1.0)
    work.mul_(pre);
  guarded(comm, call, [&] {
    comm.allreduce(work, op == ReduceOp::Average ? ReduceOp::Sum : op);
  });
  // Division by one is exact: at one rank the average is the tensor itself
  // (a full pass over every bucket saved).
  if (op == ReduceOp::Average && comm.size() > 1)
    work.div_(comm.size());
  if (post != 1.0)
    work.mul_(post);
}

Call make_call(
    OpKind kind,
    const at::Tensor& t,
    const std::string& name,
    bool verify,
    int op,
    int root,
    std::string error) {
  Descriptor d = describe(kind, t, name, op, root, error);
  at::Tensor anchor =
      error.empty() && t.defined() && !t.is_cpu() ? t : at::Tensor();
  return Call{kind, name, verify, d, anchor};
}

// The buffer a collective works in: in place, the caller's own storage when
// it is contiguous; otherwise a contiguous copy (copied back afterwards when
// in place).
at::Tensor working_copy(const at::Tensor& tensor, bool in_place) {
  return in_place && tensor.is_contiguous() ? tensor
                                            : tensor.contiguous().clone();
}

Handle allreduce_impl(
    const at::Tensor& tensor, const AllreduceOptions& o, bool in_place) {
  std::string error = check_reduction(
      tensor, o.op(), o.prescale_factor(), o.postscale_factor());
  Call call = make_call(
      OpKind::Allreduce,
      tensor,
      o.name(),
      o.verify(),
      static_cast<int>(o.op()),
      -1,
      error);
  at::Tensor work =
      error.empty() ? working_copy(tensor, in_place) : at::Tensor();
  return submit(
      std::move(call),
      [=](Communicator& comm,
          HandleState& state,
          const std::vector<Descriptor>&,
          const Call& c) {
        reduce_in_place(
            comm, c, work, o.op(), o.prescale_factor(), o.postscale_factor());
        if (in_place && !work.is_same(tensor))
          tensor.copy_(work);
        state.result = in_place ? tensor : work;
      },
      {tensor, work});
}

Handle broadcast_impl(
    const at::Tensor& tensor,
    int root,
    const CollectiveOptions& o,
    bool in_place) {
  std::string error = check_dtype(tensor);
  const int n = runtime("broadcast").info.size;
  if (error.empty() && (root < 0 || root >= n)) {
    error = "root rank " + std::to_string(root) + " is outside [0, " +
            std::to_string(n) + ")";
  }
  Call call = make_call(
      OpKind::Broadcast, tensor, o.name(), o.verify(), -1, root, error);
  at::Tensor work =
      error.empty() ? working_copy(tensor, in_place) : at::Tensor();
  return submit(
      std::move(call),
      [=](Communicator& comm,
          HandleState& state,
          const std::vector<Descriptor>&,
          const Call& c) {
        guarded(comm, c, [&] { comm.broadcast(work, root); });
        if (in_place && !work.is_same(tensor))
          tensor.copy_(work);
        state.result = in_place ? tensor : work;
      },
      {tensor, work});
}

int64_t row_bytes(const at::Tensor& t) {
  int64_t row = t.element_size();
  for (int64_t i = 1; i < t.dim(); ++i)
    row *= t.size(i);
  return row;
}

std::vector<int64_t> shape_with_dim0(const at::Tensor& t, int64_t dim0) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape[0] = dim0;
  return shape;
}

}  // namespace
}  // namespace detail

using detail::Call;
using detail::Communicator;
using detail::Descriptor;
using detail::HandleState;
using detail::OpKind;

Handle allreduce_async(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  return detail::allreduce_impl(tensor, options, /*in_place=*/false);
}

at::Tensor allreduce(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  detail::BlockingCall blocking;
  return allreduce_async(tensor, options).result();
}

Handle allreduce_async_(
    const at::Tensor& tensor, const AllreduceOptions& options) {
  return detail::allreduce_impl(tensor, options, /*in_place=*/true);
}

void allreduce_(const at::Tensor& tensor, const AllreduceOptions& options) {
  detail::BlockingCall blocking;
  allreduce_async_(tensor, options).wait();
}

Handle allgather_async(
    const at::Tensor& tensor, const CollectiveOptions& options) {
  std::string error = detail::check_dtype(tensor);
  if (error.empty() && tensor.defined() && tensor.dim() == 0) {
    error = "allgather needs at least one dimension (it concatenates dim 0)";
  }
  // Always exchanged: the descriptors carry every rank's dim 0.
  Call call = detail::make_call(
      OpKind::Allgather,
      tensor,
      options.name(),
      /*verify=*/true,
      -1,
      -1,
      error);
  at::Tensor in = error.empty() ? tensor.contiguous() : at::Tensor();
  return detail::submit(
      std::move(call),
      [in](
          Communicator& comm,
          HandleState& state,
          const std::vector<Descriptor>& all,
          const Call& c) {
        const int64_t row = detail::row_bytes(in);
        std::vector<size_t> bytes(all.size());
        int64_t rows = 0;
        for (size_t r = 0; r < all.size(); ++r) {
          bytes[r] = static_cast<size_t>(all[r].dims[0] * row);
          rows += all[r].dims[0];
        }
        at::Tensor out =
            at::empty(detail::shape_with_dim0(in, rows), in.options());
        detail::guarded(comm, c, [&] { comm.allgather(in, out, bytes); });
        state.result = out;
      },
      {in});
}

at::Tensor allgather(
    const at::Tensor& tensor, const CollectiveOptions& options) {
  detail::BlockingCall blocking;
  return allgather_async(tensor, options).result();
}

Handle broadcast_async(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  return detail::broadcast_impl(tensor, root_rank, options, false);
}

at::Tensor broadcast(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  detail::BlockingCall blocking;
  return broadcast_async(tensor, root_rank, options).result();
}

Handle broadcast_async_(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  return detail::broadcast_impl(tensor, root_rank, options, true);
}

void broadcast_(
    const at::Tensor& tensor, int root_rank, const CollectiveOptions& options) {
  detail::BlockingCall blocking;
  broadcast_async_(tensor, root_rank, options).wait();
}

Handle alltoall_async(
    const at::Tensor& tensor, const AlltoallOptions& options) {
  const int n = detail::runtime("alltoall").info.size;
  std::string error = detail::check_dtype(tensor);
  std::vector<int64_t> splits = options.splits();
  if (error.empty() && tensor.defined()) {
    if (tensor.dim() == 0) {
      error = "alltoall needs at least one dimension (it splits dim 0)";
    } else if (splits.empty()) {
      if (tensor.size(0) % n != 0) {
        error = "dim 0 (" + std::to_string(tensor.size(0)) +
                ") does not divide by the world size " + std::to_string(n) +
                "; pass splits";
      } else {
        splits.assign(n, tensor.size(0) / n);
      }
    } else if (static_cast<int>(splits.size()) != n) {
      error = "splits has " + std::to_string(splits.size()) +
              " entries, expected one per rank (" + std::to_string(n) + ")";
    } else {
      int64_t total = 0;
      for (int64_t s : splits) {
        if (s < 0)
          error = "splits must not be negative";
        total += s;
      }
      if (error.empty() && total != tensor.size(0)) {
        error = "splits sum to " + std::to_string(total) + ", but dim 0 is " +
                std::to_string(tensor.size(0));
      }
    }
  }
  Call call = detail::make_call(
      OpKind::Alltoall,
      tensor,
      options.name(),
      options.verify(),
      -1,
      -1,
      error);
  at::Tensor in = error.empty() ? tensor.contiguous() : at::Tensor();
  return detail::submit(
      std::move(call),
      [in, splits, n](
          Communicator& comm,
          HandleState& state,
          const std::vector<Descriptor>&,
          const Call& c) {
        // Every rank's send splits, so each knows what it receives.
        std::vector<int64_t> matrix(static_cast<size_t>(n) * n);
        auto mine =
            at::from_blob(const_cast<int64_t*>(splits.data()), {n}, at::kLong);
        auto all = at::from_blob(matrix.data(), {n * n}, at::kLong);
        detail::guarded(comm, c, [&] {
          comm.allgather(
              mine, all, std::vector<size_t>(n, n * sizeof(int64_t)));
        });
        const int me = comm.rank();
        const int64_t row = detail::row_bytes(in);
        std::vector<int64_t> recv(n), send_bytes(n), recv_bytes(n);
        int64_t rows = 0;
        for (int r = 0; r < n; ++r) {
          recv[r] = matrix[static_cast<size_t>(r) * n + me];
          rows += recv[r];
          send_bytes[r] = splits[r] * row;
          recv_bytes[r] = recv[r] * row;
        }
        at::Tensor out =
            at::empty(detail::shape_with_dim0(in, rows), in.options());
        detail::guarded(
            comm, c, [&] { comm.alltoall(in, send_bytes, out, recv_bytes); });
        state.result = out;
        state.splits = recv;
      },
      {in});
}

at::Tensor alltoall(const at::Tensor& tensor, const AlltoallOptions& options) {
  detail::BlockingCall blocking;
  return alltoall_async(tensor, options).result();
}

Handle reducescatter_async(
    const at::Tensor& tensor, const ReducescatterOptions& o) {
  std::string error = detail::check_reduction(
      tensor, o.op(), o.prescale_factor(), o.postscale_factor());
  if (error.empty() && tensor.defined() && tensor.dim() == 0) {
    error = "reducescatter needs at least one dimension (it splits dim 0)";
  }
  Call call = detail::make_call(
      OpKind::Reducescatter,
      tensor,
      o.name(),
      o.verify(),
      static_cast<int>(o.op()),
      -1,
      error);
  at::Tensor work = error.empty()
                        ? detail::working_copy(tensor, /*in_place=*/false)
                        : at::Tensor();
  return detail::submit(
      std::move(call),
      [work, o](
          Communicator& comm,
          HandleState& state,
          const std::vector<Descriptor>&,
          const Call& c) {
        // Reduces the whole tensor, then keeps this rank's rows: simple and
        // exact, at twice the traffic of a ring reduce-scatter.
        detail::reduce_in_place(
            comm, c, work, o.op(), o.prescale_factor(), o.postscale_factor());
        const int n = comm.size();
        const int me = comm.rank();
        const int64_t rows = work.size(0);
        const int64_t base = rows / n;
        const int64_t extra = rows % n;
        const int64_t start = me * base + std::min<int64_t>(me, extra);
        const int64_t count = base + (me < extra ? 1 : 0);
        state.result = work.narrow(0, start, count).clone();
      },
      {work});
}

at::Tensor reducescatter(
    const at::Tensor& tensor, const ReducescatterOptions& options) {
  detail::BlockingCall blocking;
  return reducescatter_async(tensor, options).result();
}

Handle barrier_async() {
  // The descriptor exchange is itself an all-gather, which no rank leaves
  // before every rank entered: it is the barrier, and it checks the call.
  Call call =
      detail::make_call(OpKind::Barrier, at::Tensor(), "", true, -1, -1, "");
  return detail::submit(
      std::move(call),
      [](Communicator&,
         HandleState&,
         const std::vector<Descriptor>&,
         const Call&) {});
}

void barrier() {
  detail::BlockingCall blocking;
  barrier_async().wait();
}

}  // namespace ronde
