// Errors that come from peers or the network rather than from the caller:
// a dead rank, a broken connection, a collective that did not finish in
// time. Mistakes in the caller's input are c10::Error (TORCH_CHECK) instead.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ronde {

class CommError : public std::runtime_error {
 public:
  enum class Kind {
    PeerFailure,  // a connection to a peer broke (the peer likely died)
    Timeout,      // the operation did not finish within the timeout
    Rendezvous,   // the job could not be assembled
    Broken,       // an earlier failure left the communicator unusable
  };

  CommError(
      Kind kind,
      std::string operation,
      std::string tensor,
      int rank,
      std::vector<int> suspect_ranks,
      std::string backend,
      std::string backend_message);

  Kind kind() const noexcept {
    return kind_;
  }
  // The collective ("allreduce", "broadcast", ...) or phase ("rendezvous").
  const std::string& operation() const noexcept {
    return operation_;
  }
  // The tensor's (or bucket's) name; empty when it had none.
  const std::string& tensor() const noexcept {
    return tensor_;
  }
  // The rank that raised this error.
  int rank() const noexcept {
    return rank_;
  }
  // Peers that did not report the failure themselves in time: dead or stuck.
  const std::vector<int>& suspect_ranks() const noexcept {
    return suspect_ranks_;
  }
  const std::string& backend() const noexcept {
    return backend_;
  }
  const std::string& backend_message() const noexcept {
    return backend_message_;
  }

 private:
  Kind kind_;
  std::string operation_;
  std::string tensor_;
  int rank_;
  std::vector<int> suspect_ranks_;
  std::string backend_;
  std::string backend_message_;
};

const char* to_string(CommError::Kind kind);

}  // namespace ronde
