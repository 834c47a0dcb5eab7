// One job from start to end: the machine-dependent setup (port, job id,
// rendezvous address, timeline directory, secret), the ranks' launches,
// their supervision, and the clean-up after it.
#pragma once

#include "options.h"

namespace ronde::detail {

// Runs the job `options` describe; returns ronderun's exit code.
int run_job(Options options);

}  // namespace ronde::detail
