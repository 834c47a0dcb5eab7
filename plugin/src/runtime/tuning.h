// The tuning values of ronde's data planes, each default written once: the
// settings (runtime/settings.h) hold them as parsed from the environment,
// the communicators (comm/) and the shared-memory transport embed them.
// Header-only and free of LibTorch, so that comm/shm/ can include it.
#pragma once

#include <chrono>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>

namespace ronde::detail {

// Rendezvous and collective timeout (RONDE_TIMEOUT_SECONDS): long enough for
// a slow rank's first step, short enough that a hung job fails while
// someone still watches it.
constexpr std::chrono::milliseconds kDefaultTimeout{30000};

// The shared-memory backend for ranks that share a host (RONDE_SHM_*).
struct ShmTuning {
  // The smallest chunk a job may ask for: one page, below which the
  // per-step synchronisation dominates. Checked where settings are parsed.
  static constexpr size_t kMinChunkBytes = 4096;

  // Where segments are made: a tmpfs on every Linux, so no disk is touched.
  std::string dir = "/dev/shm";
  // Bytes one step moves per rank: large enough to amortise a step's
  // synchronisation. 512 KiB against 256 KiB at 2 ranks, in alternating
  // rounds: all-reduces of 512 KiB 1.7x faster (one step, not two), 1 to
  // 4 MiB 1.2x, 64 MiB 2% slower; broadcast, reduce-scatter and
  // all-to-all up to 1.8x (docs/shared_memory.md).
  size_t chunk_bytes = size_t{512} << 10;
  // The largest all-reduce posted beside the call check's frames in one
  // step (every rank reducing all of it), whatever the chunk: at 256 KiB
  // that step was 1.16x slower than the check and a step of its own.
  static constexpr size_t kMaxFusedBytes = size_t{256} << 10;
  // All-reduces from this size reduce-scatter and all-gather in memory;
  // below it one sync of everyone reducing everything is cheaper. Unset:
  // split_bytes_for() the rank count.
  std::optional<size_t> split_bytes;
  // Between more than two ranks, from 1 MiB: there each rank reduces 1/n
  // instead of all n inputs. Between two ranks never: reducing whole reads
  // as much of the peer's memory as the split, with one copy and one
  // synchronisation less a step, and was 1.16x to 1.6x faster from 1 MiB
  // to 64 MiB with 512 KiB chunks (docs/shared_memory.md).
  static constexpr size_t kSplitBytes = size_t{1} << 20;
  size_t split_bytes_for(int ranks) const {
    if (split_bytes)
      return *split_bytes;
    return ranks > 2 ? kSplitBytes : std::numeric_limits<size_t>::max();
  }
  // Each rank's arena for buffers that peers read where they lie (the
  // gradient buckets): address space only, until a buffer reserves its
  // pages. 0: no arena, every all-reduce copies through the slots.
  size_t arena_bytes = size_t{16} << 30;
  // The smallest all-reduce (bytes per rank) whose buffers are read where
  // they lie when every rank's is in its arena, and the smallest buffer
  // made there (RONDE_SHM_ZERO_COPY_BYTES): one page, the least an arena
  // buffer takes; smaller all-reduces read no claims. Between two ranks,
  // without its check, such an all-reduce took 0.93x the copying one's
  // time at 4 KiB, 0.19x to 0.51x from 16 KiB to 4 MiB and 0.74x at
  // 64 MiB (benchmarks/README.md).
  size_t zero_copy_min_bytes = 4096;
};

// The host backend across hosts (RONDE_GLOO_*).
struct GlooTuning {
  // The all-reduce algorithm: "ring" or "bcube"; the ring is bandwidth
  // optimal and Gloo's own default.
  std::string algorithm = "ring";
};

}  // namespace ronde::detail
