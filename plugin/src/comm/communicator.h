// The one interface between ronde and a communication backend. Everything
// outside comm/ talks to a Communicator; only comm/ knows Gloo (or, later,
// NCCL) exists. Calls block and are made from the communication thread only.
#pragma once

#include <ronde/collectives.h>
#include <ronde/errors.h>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace ronde::detail {

struct LaunchInfo;

// Raised by a backend when a peer or the network failed; collectives turn it
// into a ronde::CommError that names the tensor and the suspect ranks.
struct BackendFailure : std::runtime_error {
  BackendFailure(CommError::Kind kind, const std::string& msg)
      : std::runtime_error(msg), kind(kind) {}
  CommError::Kind kind;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Tensors are contiguous. allreduce is in place; op is never Average
  // (the caller divides).
  virtual void allreduce(const at::Tensor& tensor, ReduceOp op) = 0;
  // out holds every rank's bytes in rank order; bytes[r] is rank r's share.
  virtual void allgather(
      const at::Tensor& in,
      const at::Tensor& out,
      const std::vector<size_t>& bytes) = 0;
  virtual void broadcast(const at::Tensor& tensor, int root) = 0;
  virtual void alltoall(
      const at::Tensor& in,
      const std::vector<int64_t>& send_bytes,
      const at::Tensor& out,
      const std::vector<int64_t>& recv_bytes) = 0;
  virtual void barrier() = 0;
  // Closes every connection so that peers blocked on this rank fail now
  // rather than at their timeout. The communicator is unusable afterwards.
  virtual void abort() = 0;
  // Closes every connection from any thread, freeing nothing: collectives
  // of peers blocked on this rank fail at once. Then abort() as above.
  virtual void interrupt() {}
};

// A job of one rank: every collective is a local copy, no network.
std::unique_ptr<Communicator> make_self_communicator();

// Loads and checks the Gloo backend module; throws c10::Error naming the
// problem. Cheap after the first call. init() calls it before the rendezvous
// so a broken installation fails on every rank at once, not at a timeout.
void load_gloo_backend();

// Connects to every other rank through the system Gloo, rendezvousing
// through `store` under `prefix`.
std::unique_ptr<Communicator> make_gloo_communicator(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::string& prefix,
    int rank,
    int size,
    const std::string& hostname,
    std::chrono::milliseconds timeout,
    const std::string& algorithm);

}  // namespace ronde::detail
