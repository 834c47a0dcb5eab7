// TrainingMonitor: per-step and per-epoch figures, reduced over ranks in one
// small allgather, printed as a progress line and written as JSON lines. The
// resource figures are sampled in resources.cpp.
#include <ronde/collectives.h>
#include <ronde/metrics.h>
#include <ronde/runtime.h>

#include "runtime/json_text.h"
#include "runtime/launch_contract.h"
#include "runtime/posix_io.h"
#include "runtime/settings.h"
#include "train/resources.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

namespace ronde {

namespace {

// A JSON number; NaN and infinities (a diverged loss) become null.
std::string json_number(double v) {
  if (!std::isfinite(v)) {
    return "null";
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

double unix_seconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// " cpu 98%  rss 412 MiB" and the rest, for a progress line.
std::string resource_text(const ResourceStats& r, bool with_peak) {
  std::string t = "  cpu " + fixed(r.cpu_percent, 0) + "%  rss " +
                  fixed(r.rss_mb, 0) + " MiB";
  if (with_peak)
    t += " (peak " + fixed(r.peak_rss_mb, 0) + ")";
  if (r.cuda) {
    t += "  cuda " + fixed(r.cuda_allocated_mb, 0) + "/" +
         fixed(r.cuda_reserved_mb, 0) + " MiB";
  }
  return t;
}

std::string resource_json(const ResourceStats& r) {
  std::string j = ",\"cpu_percent\":" + json_number(r.cpu_percent) +
                  ",\"cpu_percent_max\":" + json_number(r.cpu_percent_max) +
                  ",\"rss_mb\":" + json_number(r.rss_mb) +
                  ",\"rss_mb_max\":" + json_number(r.rss_mb_max) +
                  ",\"peak_rss_mb\":" + json_number(r.peak_rss_mb);
  if (r.cuda) {
    j += ",\"cuda_allocated_mb\":" + json_number(r.cuda_allocated_mb) +
         ",\"cuda_allocated_mb_max\":" + json_number(r.cuda_allocated_mb_max) +
         ",\"cuda_reserved_mb\":" + json_number(r.cuda_reserved_mb) +
         ",\"cuda_reserved_mb_max\":" + json_number(r.cuda_reserved_mb_max);
  }
  return j;
}

}  // namespace

TrainingMonitor::TrainingMonitor(MonitorOptions options)
    : TrainingMonitor(std::move(options), std::cout) {}

TrainingMonitor::TrainingMonitor(MonitorOptions options, std::ostream& out)
    : options_(std::move(options)), out_(out) {
  TORCH_CHECK(
      options_.log_every() >= 0,
      "TrainingMonitor: log_every must be >= 0, got ",
      options_.log_every());
  TORCH_CHECK(
      options_.epochs() >= 1 && options_.steps_per_epoch() >= 0,
      "TrainingMonitor: epochs must be >= 1 and steps_per_epoch >= 0, got ",
      options_.epochs(),
      " and ",
      options_.steps_per_epoch());
  if (is_initialized()) {
    rank_ = rank();
    size_ = size();
  }
  if (detail::settings().log_all_ranks) {
    options_.all_ranks(true);
  }
  printing_ = rank_ == 0 || options_.all_ranks();
  if (!options_.metrics_out().empty() && printing_) {
    std::string path = options_.metrics_out();
    if (!detail::substitute_rank(path, rank_) && rank_ != 0) {
      // all_ranks without {rank}: only rank 0 owns the file.
      path.clear();
    }
    if (!path.empty()) {
      json_ = std::make_unique<std::ofstream>(path, std::ios::trunc);
      TORCH_CHECK(
          json_->good(),
          "TrainingMonitor: rank ",
          rank_,
          " cannot open the metrics file '",
          path,
          "': ",
          detail::errno_text());
    }
  }
}

TrainingMonitor::~TrainingMonitor() = default;

std::string TrainingMonitor::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) {
    return "?";
  }
  auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(
        buf,
        sizeof buf,
        "%lldm%02llds",
        static_cast<long long>(s / 60),
        static_cast<long long>(s % 60));
  } else {
    std::snprintf(
        buf,
        sizeof buf,
        "%lldh%02lldm",
        static_cast<long long>(s / 3600),
        static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

void TrainingMonitor::start_epoch(int64_t epoch, int64_t steps_done) {
  TORCH_CHECK(
      epoch >= -1 && steps_done >= 0,
      "TrainingMonitor: rank ",
      rank_,
      ": bad start_epoch(",
      epoch,
      ", ",
      steps_done,
      ")");
  epoch_ = epoch >= 0 ? epoch + 1 : epoch_ + 1;
  step_in_epoch_ = steps_done;
  if (epoch >= 0 || steps_done > 0) {
    global_step_ = (epoch_ - 1) * options_.steps_per_epoch() + steps_done;
  }
  open(window_);
  open(epoch_window_);
  last_progress_ = StepStats();
  last_tick_ = Clock::now();
}

void TrainingMonitor::open(Window& w) {
  w = Window();
  w.cpu_start = detail::process_cpu_seconds();
  w.wall_start = Clock::now();
}

TrainingMonitor::Reduced TrainingMonitor::reduce(const Window& w) const {
  // This rank's figures, in the order of the columns below.
  const double wall =
      std::chrono::duration<double>(Clock::now() - w.wall_start).count();
  double cuda_allocated = 0, cuda_reserved = 0;
  const bool cuda = detail::cuda_memory_mb(cuda_allocated, cuda_reserved);
  enum Column {
    kLoss,
    kSteps,
    kSamples,
    kWait,
    kSeconds,
    kCpu,
    kRss,
    kPeak,
    kCuda,
    kCudaAllocated,
    kCudaReserved,
    kColumns
  };
  std::vector<double> mine(kColumns);
  mine[kLoss] = w.loss_sum;
  mine[kSteps] = static_cast<double>(w.steps);
  mine[kSamples] = static_cast<double>(w.samples);
  mine[kWait] = w.wait_seconds;
  mine[kSeconds] = w.seconds;
  mine[kCpu] =
      wall > 0 ? 100.0 * (detail::process_cpu_seconds() - w.cpu_start) / wall
               : 0;
  mine[kRss] = detail::rss_mb();
  // The kernel's high-water mark trails the resident size by a page
  // accounting batch; never report a peak below the present.
  mine[kPeak] = std::max(detail::peak_rss_mb(), mine[kRss]);
  mine[kCuda] = cuda ? 1 : 0;
  mine[kCudaAllocated] = cuda_allocated;
  mine[kCudaReserved] = cuda_reserved;
  // One row per rank: means and maxima both come from the rows.
  at::Tensor rows = at::tensor(mine, at::kDouble).view({1, kColumns});
  const bool over_ranks = options_.reduce_over_ranks() && size_ > 1;
  if (over_ranks) {
    rows = allgather(
        rows, CollectiveOptions().name("ronde.metrics").verify(false));
  }
  const int64_t n = rows.size(0);
  auto v = rows.accessor<double, 2>();
  auto mean = [&](int c) {
    double sum = 0;
    for (int64_t r = 0; r < n; ++r)
      sum += v[r][c];
    return sum / static_cast<double>(n);
  };
  auto most = [&](int c) {
    double m = v[0][c];
    for (int64_t r = 1; r < n; ++r)
      m = std::max(m, v[r][c]);
    return m;
  };
  Reduced out;
  Window& g = out.window;
  g = w;
  // Ranks run the same steps: loss, wait and time become means over
  // ranks, samples the job's total.
  g.loss_sum = mean(kLoss);
  g.steps = static_cast<int64_t>(std::llround(mean(kSteps)));
  g.samples = over_ranks
                  ? static_cast<int64_t>(std::llround(mean(kSamples) * n))
                  : w.samples * (options_.reduce_over_ranks() ? size_ : 1);
  g.wait_seconds = mean(kWait);
  g.seconds = mean(kSeconds);
  ResourceStats& r = out.resources;
  r.cpu_percent = mean(kCpu);
  r.cpu_percent_max = most(kCpu);
  r.rss_mb = mean(kRss);
  r.rss_mb_max = most(kRss);
  r.peak_rss_mb = most(kPeak);
  // Averaged over the ranks that use a device.
  double users = 0, allocated = 0, reserved = 0;
  for (int64_t row = 0; row < n; ++row) {
    if (v[row][kCuda] > 0) {
      users += 1;
      allocated += v[row][kCudaAllocated];
      reserved += v[row][kCudaReserved];
    }
  }
  if (users > 0) {
    r.cuda = true;
    r.cuda_allocated_mb = allocated / users;
    r.cuda_allocated_mb_max = most(kCudaAllocated);
    r.cuda_reserved_mb = reserved / users;
    r.cuda_reserved_mb_max = most(kCudaReserved);
  }
  return out;
}

void TrainingMonitor::step(
    double loss, int64_t samples, double comm_wait_seconds) {
  TORCH_CHECK(
      epoch_ > 0,
      "TrainingMonitor: rank ",
      rank_,
      " called step() before start_epoch()");
  auto now = Clock::now();
  double dt = std::chrono::duration<double>(now - last_tick_).count();
  last_tick_ = now;
  ++step_in_epoch_;
  ++global_step_;
  for (Window* w : {&window_, &epoch_window_}) {
    w->loss_sum += loss;
    w->steps += 1;
    w->samples += samples;
    w->wait_seconds += comm_wait_seconds;
    w->seconds += dt;
  }
  if (options_.log_every() == 0 || step_in_epoch_ % options_.log_every() != 0) {
    return;
  }
  const Reduced reduced = reduce(window_);
  const Window& g = reduced.window;
  open(window_);
  StepStats s;
  s.resources = reduced.resources;
  s.epoch = epoch_;
  s.step = step_in_epoch_;
  s.global_step = global_step_;
  s.loss = g.steps > 0 ? g.loss_sum / g.steps : 0;
  s.step_seconds = g.steps > 0 ? g.seconds / g.steps : 0;
  s.samples_per_s = g.seconds > 0 ? g.samples / g.seconds : 0;
  s.comm_wait_share = g.seconds > 0 ? g.wait_seconds / g.seconds : 0;
  if (options_.steps_per_epoch() > 0) {
    int64_t total = options_.epochs() * options_.steps_per_epoch();
    s.eta_seconds =
        static_cast<double>(std::max<int64_t>(0, total - global_step_)) *
        s.step_seconds;
  }
  last_progress_ = s;
  if (!printing_) {
    return;
  }
  std::ostringstream line;
  line << "epoch " << epoch_ << "/" << options_.epochs() << " step " << s.step;
  if (options_.steps_per_epoch() > 0) {
    line << "/" << options_.steps_per_epoch();
  }
  line << "  loss " << fixed(s.loss, 4) << "  " << fixed(s.samples_per_s, 0)
       << " samples/s  " << fixed(s.step_seconds * 1e3, 1)
       << " ms/step  comm wait " << fixed(100 * s.comm_wait_share, 1) << "%";
  line << resource_text(s.resources, false);
  if (s.eta_seconds >= 0) {
    line << "  ETA " << format_duration(s.eta_seconds);
  }
  std::ostringstream json;
  json << "{\"event\":\"step\",\"rank\":" << rank_ << ",\"size\":" << size_
       << ",\"epoch\":" << s.epoch << ",\"epochs\":" << options_.epochs()
       << ",\"step\":" << s.step
       << ",\"steps_per_epoch\":" << options_.steps_per_epoch()
       << ",\"global_step\":" << s.global_step
       << ",\"loss\":" << json_number(s.loss)
       << ",\"samples_per_s\":" << json_number(s.samples_per_s)
       << ",\"step_seconds\":" << json_number(s.step_seconds)
       << ",\"comm_wait_share\":" << json_number(s.comm_wait_share)
       << ",\"eta_seconds\":"
       << (s.eta_seconds >= 0 ? json_number(s.eta_seconds) : "null")
       << resource_json(s.resources) << ",\"time\":" << fixed(unix_seconds(), 3)
       << "}";
  emit(line.str(), json.str());
}

EpochStats TrainingMonitor::end_epoch(
    std::vector<std::pair<std::string, double>> metrics) {
  TORCH_CHECK(
      epoch_ > 0,
      "TrainingMonitor: rank ",
      rank_,
      " called end_epoch() before start_epoch()");
  const Reduced reduced = reduce(epoch_window_);
  const Window& g = reduced.window;
  EpochStats e;
  e.resources = reduced.resources;
  e.epoch = epoch_;
  e.steps = g.steps;
  e.seconds = g.seconds;
  e.train_loss = g.steps > 0 ? g.loss_sum / g.steps : 0;
  e.samples_per_s = g.seconds > 0 ? g.samples / g.seconds : 0;
  e.comm_wait_share = g.seconds > 0 ? g.wait_seconds / g.seconds : 0;
  e.metrics = std::move(metrics);
  epochs_.push_back(e);
  if (printing_) {
    std::ostringstream line;
    line << "epoch " << e.epoch << "/" << options_.epochs() << " done in "
         << fixed(e.seconds, 1) << " s  train loss " << fixed(e.train_loss, 4)
         << "  " << fixed(e.samples_per_s, 0) << " samples/s  comm wait "
         << fixed(100 * e.comm_wait_share, 1) << "%"
         << resource_text(e.resources, true);
    for (const auto& [name, value] : e.metrics) {
      line << "  " << name << " " << fixed(value, 4);
    }
    std::ostringstream json;
    json << "{\"event\":\"epoch\",\"rank\":" << rank_ << ",\"size\":" << size_
         << ",\"epoch\":" << e.epoch << ",\"epochs\":" << options_.epochs()
         << ",\"steps\":" << e.steps
         << ",\"epoch_seconds\":" << json_number(e.seconds)
         << ",\"train_loss\":" << json_number(e.train_loss)
         << ",\"samples_per_s\":" << json_number(e.samples_per_s)
         << ",\"comm_wait_share\":" << json_number(e.comm_wait_share)
         << resource_json(e.resources);
    for (const auto& [name, value] : e.metrics) {
      json << ",\"" << detail::json_escape(name) << "\":" << json_number(value);
    }
    json << ",\"time\":" << fixed(unix_seconds(), 3) << "}";
    emit(line.str(), json.str());
  }
  return e;
}

void TrainingMonitor::emit(const std::string& line, const std::string& json) {
  if (options_.all_ranks()) {
    out_ << "rank " << rank_ << ": ";
  }
  out_ << line << std::endl;
  if (json_) {
    *json_ << json << '\n';
    json_->flush();
    TORCH_CHECK(
        json_->good(),
        "TrainingMonitor: rank ",
        rank_,
        " failed to write the metrics file (disk full?)");
  }
}

}  // namespace ronde
