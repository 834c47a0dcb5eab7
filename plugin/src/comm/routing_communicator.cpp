// The job's communicator as the rest of ronde sees it: each call goes to the
// backend for its tensor. CPU tensors (and CUDA tensors where NCCL is not
// built, or not wanted) go to the host backend: Gloo, or local copies for a
// job of one rank. CUDA tensors go to NCCL, one communicator per device,
// connected the first time a collective needs it: every rank runs the same
// sequence of collectives, so every rank connects at the same point of it,
// and a job that never puts a tensor on the GPU never starts CUDA or NCCL.
#include "comm/communicator.h"
#include "comm/host_types.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <mutex>

namespace ronde::detail {
namespace {

class RoutingCommunicator final : public Communicator {
 public:
  RoutingCommunicator(
      CommConfig config,
      CommGroup group,
      std::unique_ptr<Communicator> host,
      bool nccl)
      : config_(std::move(config)),
        group_(std::move(group)),
        host_(std::move(host)),
        nccl_(nccl) {}

  const char* backend() const override {
    return host_->backend();
  }
  const char* backend_for(const at::Tensor& t) const override {
    return on_device(t) ? "nccl" : host_->backend();
  }
  bool prefers_inline_payloads() const override {
    return host_->prefers_inline_payloads();  // the check is a host call
  }
  bool exchange_frames(
      const uint8_t* mine,
      size_t frame_bytes,
      uint8_t* frames,
      const FusedAllreduce* fused) override {
    return host_->exchange_frames(mine, frame_bytes, frames, fused);
  }
  size_t fused_capacity(size_t frame_bytes) const override {
    return host_->fused_capacity(frame_bytes);  // fused work is on the host
  }
  bool reads_in_place(const at::Tensor& t) const override {
    return t.device().is_cpu() && host_->reads_in_place(t);
  }
  int rank() const override {
    return host_->rank();
  }
  int size() const override {
    return host_->size();
  }

  std::optional<c10::Stream> stream_for(const at::Tensor& t) override {
    return route(t).stream_for(t);
  }
  void watch(
      const at::Tensor& t, const std::shared_ptr<DeviceWork>& work) override {
    route(t).watch(t, work);
  }

  void allreduce(const at::Tensor& t, BackendOp op) override {
    route(t).allreduce(t, op);
  }
  bool allreduce_scaled(
      const at::Tensor& t, BackendOp op, double scale) override {
    return route(t).allreduce_scaled(t, op, scale);
  }
  void allgather(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<size_t>& bytes) override {
    route(in).allgather(in, out, bytes);
  }
  void broadcast(const at::Tensor& t, int root) override {
    route(t).broadcast(t, root);
  }
  void alltoall(
      const at::Tensor& in,
      const std::vector<int64_t>& send_bytes,
      const at::Tensor& out,
      const std::vector<int64_t>& recv_bytes) override {
    route(in).alltoall(in, send_bytes, out, recv_bytes);
  }
  void reduce_scatter(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<int64_t>& counts,
      BackendOp op) override {
    route(in).reduce_scatter(in, out, counts, op);
  }
  void barrier() override {
    host_->barrier();
  }
  std::optional<at::Tensor> shared_zeros(
      int64_t numel, const at::TensorOptions& options) override {
    if (options.device().type() != c10::DeviceType::CPU)
      return std::nullopt;
    return host_->shared_zeros(numel, options);
  }
  void abort() override {
    host_->abort();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [_, c] : devices_)
      c->abort();
  }
  void interrupt() override {
    host_->interrupt();
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [_, c] : devices_)
      c->interrupt();
  }

 private:
  // The rows of the dtype table that NCCL cannot reduce (int16) stay on
  // the host backend; types outside the table fail on NCCL with a message.
  bool on_device(const at::Tensor& t) const {
    if (!nccl_ || !t.defined() || !t.is_cuda())
      return false;
    const int code = host_dtype(t.scalar_type());
    return code < 0 || dtype_on_nccl(code);
  }

  Communicator& route(const at::Tensor& t) {
    if (!on_device(t))
      return *host_;
    const c10::Device device = t.device();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(device.index());
    if (it != devices_.end())
      return *it->second;
#ifdef RONDE_WITH_NCCL
    CommGroup on_device = group_;
    on_device.prefix += "nccl/" + std::to_string(devices_.size()) + "/";
    auto comm = make_nccl_communicator(config_, on_device, device);
    return *devices_.emplace(device.index(), std::move(comm)).first->second;
#else
    TORCH_INTERNAL_ASSERT(false, "NCCL routing in a build without NCCL");
#endif
  }

  const CommConfig config_;
  const CommGroup group_;
  std::unique_ptr<Communicator> host_;
  const bool nccl_;
  // Inserted by the communication thread, walked by interrupt() from any.
  std::mutex mutex_;
  std::map<c10::DeviceIndex, std::unique_ptr<Communicator>> devices_;
};

// Which backend serves CUDA tensors, as configured: "nccl", or "gloo" for
// the host backend through staging copies. The spelling was checked where
// the settings were parsed; whether NCCL is built is known only here.
std::string cuda_backend_choice(const std::string& want) {
  if (want.empty())
    return kNcclBuilt ? "nccl" : "gloo";
  TORCH_INTERNAL_ASSERT(
      want == "nccl" || want == "gloo", "unchecked CUDA backend ", want);
  TORCH_CHECK(
      want != "nccl" || kNcclBuilt,
      "ronde: RONDE_CUDA_BACKEND=nccl, but this ronde was built without "
      "NCCL (configure with -DRONDE_WITH_NCCL=ON against a CUDA LibTorch)");
  return want;
}

// Whether every rank reported the same host identity.
bool one_host(const std::vector<std::string>& hosts) {
  return !hosts.empty() &&
         std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) {
           return !h.empty() && h == hosts[0];
         });
}

}  // namespace

void load_backends(const CommConfig& config, const CommGroup& group) {
  cuda_backend_choice(config.cuda_backend);  // fails before the rendezvous
  if (group.size > 1)
    load_gloo_backend(config.gloo);
}

namespace {
// The group's ranks under `name` in the store.
CommGroup subgroup(const CommGroup& group, const std::string& name) {
  CommGroup g = group;
  g.prefix += name;
  return g;
}
}  // namespace

std::unique_ptr<Communicator> make_communicator(
    const CommConfig& config, const CommGroup& group) {
  std::unique_ptr<Communicator> host;
  if (group.size == 1) {
    host = make_self_communicator();
  } else if (config.shm.enabled && one_host(group.hosts)) {
    try {
      host = make_shm_communicator(config, subgroup(group, "shm/"));
    } catch (const ShmUnavailable& e) {
      // Every rank got the same verdict; one line says so.
      if (group.rank == 0) {
        std::cerr << "ronde: warning: shared memory is unavailable ("
                  << e.what()
                  << "); the ranks of this host use Gloo over loopback "
                     "instead (RONDE_SHM=0 skips the attempt)"
                  << std::endl;
      }
    }
  }
  if (!host) {
    host = make_gloo_communicator(config, subgroup(group, "gloo/"));
    if (!one_host(group.hosts))
      host = make_hierarchical_communicator(config, group, std::move(host));
  }
  const bool nccl = cuda_backend_choice(config.cuda_backend) == "nccl";
  return std::make_unique<RoutingCommunicator>(
      config, group, std::move(host), nccl);
}

}  // namespace ronde::detail
