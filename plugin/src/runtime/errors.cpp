// ronde::CommError: one message that says what failed, where, and whom to
// suspect.
#include <ronde/errors.h>

#include <sstream>

namespace ronde {
namespace {

std::string format(
    CommError::Kind kind,
    const std::string& operation,
    const std::string& tensor,
    int rank,
    const std::vector<int>& suspects,
    const std::string& backend,
    const std::string& message) {
  std::ostringstream os;
  os << "ronde: " << operation;
  if (!tensor.empty())
    os << " of '" << tensor << "'";
  os << " failed on rank " << rank << " (" << backend << ", " << to_string(kind)
     << ")";
  if (!suspects.empty()) {
    os << "; rank" << (suspects.size() > 1 ? "s" : "") << " ";
    for (size_t i = 0; i < suspects.size(); ++i) {
      os << (i ? ", " : "") << suspects[i];
    }
    os << " did not report the failure in time (dead or stuck)";
  }
  os << ": " << message;
  return os.str();
}

}  // namespace

const char* to_string(CommError::Kind kind) {
  switch (kind) {
    case CommError::Kind::PeerFailure:
      return "peer failure";
    case CommError::Kind::Timeout:
      return "timeout";
    case CommError::Kind::Rendezvous:
      return "rendezvous";
    case CommError::Kind::Broken:
      return "broken communicator";
  }
  return "unknown";
}

CommError::CommError(
    Kind kind,
    std::string operation,
    std::string tensor,
    int rank,
    std::vector<int> suspect_ranks,
    std::string backend,
    std::string backend_message)
    : std::runtime_error(format(
          kind,
          operation,
          tensor,
          rank,
          suspect_ranks,
          backend,
          backend_message)),
      kind_(kind),
      operation_(std::move(operation)),
      tensor_(std::move(tensor)),
      rank_(rank),
      suspect_ranks_(std::move(suspect_ranks)),
      backend_(std::move(backend)),
      backend_message_(std::move(backend_message)) {}

}  // namespace ronde
