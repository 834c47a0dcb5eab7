// Binding a rank to its share of the host's CPUs (RONDE_BIND_TO, which
// ronderun --bind-to sets; core by default there). Two ranks that the
// scheduler puts on one core make every shared-memory wait hand the CPU
// back and forth; ranks on CPUs of their own keep their spins short, as
// Open MPI's default binding does. A share is the rank's own: its intra-op
// threads run there, apart from the other ranks'.
#pragma once

#include <string>
#include <vector>

namespace ronde::detail {

// The CPUs local rank `local_rank` of `local_size` takes, from `allowed`
// (sorted CPU ids; `package[i]` the socket of allowed[i]):
// - "core": the allowed CPUs cut into local_size contiguous shares of
//   floor(n / local_size), the share of local_rank;
// - "socket": every allowed CPU of socket (local_rank mod sockets);
// - "none" or "": nothing (empty).
// Empty with `why` set when the ranks outnumber the CPUs (core) or the
// mode is unknown. Pure: unit tested.
std::vector<int> cpus_for_rank(
    const std::string& mode,
    const std::vector<int>& allowed,
    const std::vector<int>& package,
    int local_rank,
    int local_size,
    std::string& why);

// Binds the calling thread, and the threads it creates afterwards, to
// cpus_for_rank() of this process's allowed CPUs. Returns a warning for
// the log ("" when bound, or when the mode is none).
std::string bind_process(
    const std::string& mode, int local_rank, int local_size);

}  // namespace ronde::detail
