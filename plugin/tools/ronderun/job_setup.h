// The values a job takes from this machine before its ranks start: a free
// port, a fresh job id, and the rendezvous address every host can reach.
#pragma once

#include "options.h"

#include <string>

namespace ronde::detail {

// Closed standard descriptors would be reused for the pipes, and dup2 onto
// the same number in the child would then clobber one stream with another;
// reopens them on /dev/null. False when that fails.
bool ensure_std_fds_open();

// Sets options.port to a port free here; returns an error, or "".
std::string pick_free_port(Options& options);

// "ronde-PID-HEX": needs only to differ between concurrent jobs here.
std::string make_job_id();

// Sets options.host for a multi-host job without --host; returns an
// error, or "".
std::string choose_rendezvous_address(Options& options);

}  // namespace ronde::detail
