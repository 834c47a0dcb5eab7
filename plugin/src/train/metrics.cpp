#include <ronde/collectives.h>
#include <ronde/metrics.h>
#include <ronde/runtime.h>

#include "runtime/json_text.h"
#include "runtime/settings.h"

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
    auto at = path.find("{rank}");
    if (at != std::string::npos) {
      path.replace(at, 6, std::to_string(rank_));
    } else if (rank_ != 0) {
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
          std::strerror(errno));
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
  window_ = Window();
  epoch_window_ = Window();
  last_progress_ = StepStats();
  last_tick_ = Clock::now();
}

TrainingMonitor::Window TrainingMonitor::reduce(const Window& w) const {
  Window r = w;
  if (options_.reduce_over_ranks() && size_ > 1) {
    auto t = at::tensor(
        {w.loss_sum,
         static_cast<double>(w.steps),
         static_cast<double>(w.samples),
         w.wait_seconds,
         w.seconds},
        at::kDouble);
    allreduce_(
        t,
        AllreduceOptions()
            .op(ReduceOp::Sum)
            .name("ronde.metrics")
            .verify(false));
    auto v = t.accessor<double, 1>();
    // Ranks run the same steps: loss, wait and time become means over
    // ranks, samples the job's total.
    r.loss_sum = v[0] / size_;
    r.steps = static_cast<int64_t>(std::llround(v[1] / size_));
    r.samples = static_cast<int64_t>(std::llround(v[2]));
    r.wait_seconds = v[3] / size_;
    r.seconds = v[4] / size_;
  } else {
    r.samples = w.samples * (options_.reduce_over_ranks() ? size_ : 1);
  }
  return r;
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
  Window g = reduce(window_);
  window_ = Window();
  StepStats s;
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
       << ",\"time\":" << fixed(unix_seconds(), 3) << "}";
  emit(line.str(), json.str());
}

EpochStats TrainingMonitor::end_epoch(
    std::vector<std::pair<std::string, double>> metrics) {
  TORCH_CHECK(
      epoch_ > 0,
      "TrainingMonitor: rank ",
      rank_,
      " called end_epoch() before start_epoch()");
  Window g = reduce(epoch_window_);
  EpochStats e;
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
         << fixed(100 * e.comm_wait_share, 1) << "%";
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
         << ",\"comm_wait_share\":" << json_number(e.comm_wait_share);
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
