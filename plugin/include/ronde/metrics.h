// Progress lines and training metrics: what an operator reads to tell whether
// a run is healthy and whether distribution pays (loss, throughput, time per
// step, the share of it spent waiting on communication, ETA, epoch summaries).
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ronde {

struct MonitorOptions {
  // Steps between progress lines (and "step" records). 0: epoch summaries
  // only.
  TORCH_ARG(int64_t, log_every) = 50;
  TORCH_ARG(int64_t, epochs) = 1;
  // Steps each epoch has, for "step 100/469" and the ETA. 0: unknown.
  TORCH_ARG(int64_t, steps_per_epoch) = 0;
  // Print on every rank (each line then names its rank). Default: rank 0
  // only; RONDE_LOG_ALL_RANKS=1 turns it on too.
  TORCH_ARG(bool, all_ranks) = false;
  // JSON lines file with the same figures, written by rank 0 (with
  // all_ranks, by every rank: "{rank}" in the path is replaced by the rank).
  // Empty: none.
  TORCH_ARG(std::string, metrics_out) = "";
  // Average the figures over ranks at each progress line and epoch end: one
  // small all-reduce, so every rank must call step() and end_epoch() the
  // same number of times (as every data-parallel loop does). Off: rank-local
  // figures, no communication.
  TORCH_ARG(bool, reduce_over_ranks) = true;
};

// What the processes take of their machines: the mean over ranks and the
// largest rank's figure (with reduce_over_ranks; else this rank's, twice).
struct ResourceStats {
  // Process CPU time over wall time since the last line (or the epoch's
  // start), in percent of one core: 250 is two and a half cores busy.
  double cpu_percent = 0;
  double cpu_percent_max = 0;
  // Resident memory now, and the most it has been since the process began
  // (the max over ranks), in MiB.
  double rss_mb = 0;
  double rss_mb_max = 0;
  double peak_rss_mb = 0;
  // The caching allocator of the process's current CUDA device: memory in
  // tensors, and memory it holds from the driver, in MiB. Set only in a
  // process that has used CUDA.
  bool cuda = false;
  double cuda_allocated_mb = 0;
  double cuda_allocated_mb_max = 0;
  double cuda_reserved_mb = 0;
  double cuda_reserved_mb_max = 0;
};

// Figures over the steps since the last progress line.
struct StepStats {
  int64_t epoch = 0;  // 1-based
  int64_t step = 0;   // 1-based, within the epoch
  int64_t global_step = 0;
  double loss = 0;           // mean over those steps (and ranks)
  double samples_per_s = 0;  // whole job: every rank's samples
  double step_seconds = 0;   // wall time per step
  // Share of the step time step() spent waiting for all-reduces after
  // backward: communication the backward pass did not hide.
  double comm_wait_share = 0;
  double eta_seconds = -1;  // -1: unknown
  ResourceStats resources;
};

struct EpochStats {
  int64_t epoch = 0;  // 1-based
  int64_t steps = 0;
  double seconds = 0;  // wall time of the epoch's steps (no evaluation)
  double train_loss = 0;
  double samples_per_s = 0;
  double comm_wait_share = 0;
  ResourceStats resources;  // over the epoch's steps
  // What the caller measured after the epoch (validation loss, accuracy),
  // already global.
  std::vector<std::pair<std::string, double>> metrics;
};

// Typical loop:
//   ronde::TrainingMonitor monitor(ronde::MonitorOptions()
//       .epochs(3).steps_per_epoch(n).metrics_out("metrics.jsonl"));
//   for (epoch ...) {
//     monitor.start_epoch();
//     for (batch ...) { ...; opt.step();
//       monitor.step(loss.item<double>(), batch_size,
//                    opt.last_step_profile().wait_seconds); }
//     monitor.end_epoch({{"val_loss", vl}, {"val_acc", va}});
//   }
class TrainingMonitor {
 public:
  // Lines go to `out` (default std::cout). Rank and size are ronde's when
  // initialised, else 0 and 1.
  explicit TrainingMonitor(MonitorOptions options = {});
  TrainingMonitor(MonitorOptions options, std::ostream& out);
  ~TrainingMonitor();

  // Starts epoch `epoch` (0-based; -1: the one after the last) with
  // `steps_done` of its steps already done (a run resumed mid-epoch).
  void start_epoch(int64_t epoch = -1, int64_t steps_done = 0);
  // After each optimizer step: this rank's loss, the samples this rank
  // trained on, and the seconds step() waited on communication
  // (DistributedOptimizer::last_step_profile().wait_seconds).
  void step(double loss, int64_t samples, double comm_wait_seconds = 0);
  // Prints the epoch summary with `metrics` appended and records it.
  EpochStats end_epoch(
      std::vector<std::pair<std::string, double>> metrics = {});

  // The figures of the last progress line, if any this epoch.
  const StepStats& last_progress() const {
    return last_progress_;
  }
  const std::vector<EpochStats>& epochs() const {
    return epochs_;
  }
  // Whether this rank prints.
  bool printing() const {
    return printing_;
  }

  // "45s", "3m07s", "1h02m".
  static std::string format_duration(double seconds);

 private:
  using Clock = std::chrono::steady_clock;
  struct Window {
    double loss_sum = 0;
    int64_t steps = 0;
    int64_t samples = 0;
    double wait_seconds = 0;
    double seconds = 0;
    // The process's CPU seconds and the wall clock when the window began.
    double cpu_start = 0;
    Clock::time_point wall_start;
  };
  struct Reduced {
    Window window;
    ResourceStats resources;
  };
  // Combines `w` and this process's resource figures over ranks when
  // reduce_over_ranks (loss, wait and time averaged, samples summed,
  // resources averaged and maxed): one small allgather.
  Reduced reduce(const Window& w) const;
  // Starts `w` now.
  static void open(Window& w);
  void emit(const std::string& line, const std::string& json);

  MonitorOptions options_;
  std::ostream& out_;
  int rank_ = 0;
  int size_ = 1;
  bool printing_ = true;
  std::unique_ptr<std::ofstream> json_;

  int64_t epoch_ = 0;  // 1-based, 0 before the first start_epoch()
  int64_t step_in_epoch_ = 0;
  int64_t global_step_ = 0;
  Clock::time_point last_tick_;
  Window window_;
  Window epoch_window_;
  StepStats last_progress_;
  std::vector<EpochStats> epochs_;
};

}  // namespace ronde
