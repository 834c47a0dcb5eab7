// What this process uses, sampled for TrainingMonitor's lines: CPU time,
// resident memory and its peak from the kernel, and the CUDA caching
// allocator's figures. Each read is cheap (a syscall or a counter).
#pragma once

namespace ronde::detail {

// CPU seconds of every thread of the process so far.
double process_cpu_seconds();

// Resident set size now, in MiB; 0 where /proc/self/statm is missing.
double rss_mb();

// The kernel's high-water mark of the resident set size, in MiB.
double peak_rss_mb();

// The caching allocator's memory in tensors and held from the driver, in
// MiB, for the current CUDA device; false (and nothing set) where this
// process has no CUDA context yet.
bool cuda_memory_mb(double& allocated, double& reserved);

}  // namespace ronde::detail
