// Resource sampling (see resources.h), from /proc, getrusage and the CUDA
// hooks, so that a CPU-only build needs no CUDA library.
#include "train/resources.h"

#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>

namespace ronde::detail {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

double process_cpu_seconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
    return 0;
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

double rss_mb() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr)
    return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  if (n != 2)
    return 0;
  return static_cast<double>(resident) *
         static_cast<double>(sysconf(_SC_PAGESIZE)) / kMiB;
}

double peak_rss_mb() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0)
    return 0;
  return static_cast<double>(u.ru_maxrss) * 1024.0 / kMiB;  // KiB on Linux
}

// Only where this process already made the device's context: asking would
// otherwise create one (hundreds of MiB) in a job that never uses the GPU.
bool cuda_memory_mb(double& allocated, double& reserved) {
  const auto accelerator = at::accelerator::getAccelerator(false);
  if (!accelerator || *accelerator != c10::DeviceType::CUDA ||
      !at::detail::getCUDAHooks().hasCUDA())
    return false;
  const c10::DeviceIndex device = at::accelerator::getDeviceIndex();
  if (device < 0 || !at::detail::getCUDAHooks().hasPrimaryContext(device))
    return false;
  const auto stats = at::accelerator::getDeviceStats(device);
  const auto all =
      static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  allocated = static_cast<double>(stats.allocated_bytes[all].current) / kMiB;
  reserved = static_cast<double>(stats.reserved_bytes[all].current) / kMiB;
  return true;
}

}  // namespace ronde::detail
