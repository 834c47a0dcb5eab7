// nccl-tests-style all-reduce sweep over ronde's collectives. Run under
// ronderun: `ronderun -np 2 allreduce_bench -b 4K -e 256M -f 2 --json
// out.json`. For each size: warm-up calls, then timed calls; the median is
// reported as time, algbw (bytes / time) and busbw (algbw x 2(n-1)/n), with the
// cross-rank descriptor check on (the default) and off, so the check's
// cost is measured rather than guessed.
#include <ronde/ronde.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end;
  int64_t mult = 1;
  if (unit == "K" || unit == "k")
    mult = 1 << 10;
  else if (unit == "M" || unit == "m")
    mult = 1 << 20;
  else if (unit == "G" || unit == "g")
    mult = 1 << 30;
  else if (!unit.empty())
    throw std::invalid_argument("bad size: " + s);
  return static_cast<int64_t>(v * mult);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of one in-place all-reduce, timed between barriers so that
// every rank measures the same collective.
double time_allreduce(at::Tensor& t, bool verify, int warmup, int iters) {
  auto opts = ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).verify(verify);
  for (int i = 0; i < warmup; ++i)
    ronde::allreduce_(t, opts);
  std::vector<double> samples;
  for (int i = 0; i < iters; ++i) {
    ronde::barrier();
    auto t0 = std::chrono::steady_clock::now();
    ronde::allreduce_(t, opts);
    auto t1 = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  // Every rank reports rank 0's clock: take the max over ranks of the median.
  at::Tensor m = at::full({1}, median(samples), at::kDouble);
  ronde::allreduce_(m, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
  return m.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t begin = 4 << 10, end = 256 << 20;
  double factor = 2;
  int warmup = 3, min_iters = 5;
  double target_seconds = 0.5;  // per size and mode, beyond min_iters
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc)
        throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "-b")
      begin = parse_size(next());
    else if (a == "-e")
      end = parse_size(next());
    else if (a == "-f")
      factor = std::stod(next());
    else if (a == "-w")
      warmup = std::stoi(next());
    else if (a == "-n")
      min_iters = std::stoi(next());
    else if (a == "--json")
      json_path = next();
    else {
      std::cerr << "usage: allreduce_bench [-b 4K] [-e 256M] [-f 2] [-w 3] "
                   "[-n 5] [--json FILE]\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  ronde::init();
  const int n = ronde::size();
  const int rank = ronde::rank();
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  std::ostringstream json;
  json << "{\"benchmark\":\"allreduce\",\"impl\":\"ronde\",\"ranks\":" << n
       << ",\"dtype\":\"float32\",\"op\":\"sum\",\"results\":[";
  if (rank == 0) {
    std::printf(
        "# ronde allreduce, %d ranks, float32 sum, in place, median\n", n);
    std::printf(
        "%12s %10s %10s %10s %10s %10s\n",
        "bytes",
        "time_us",
        "algbw_GBs",
        "busbw_GBs",
        "nocheck_us",
        "check_cost");
  }
  bool first = true;
  for (double bytes = static_cast<double>(begin); bytes <= end;
       bytes *= factor) {
    int64_t count = static_cast<int64_t>(bytes) / 4;
    at::Tensor t = at::ones({count});
    // Enough iterations for about target_seconds, never fewer than min_iters.
    double probe = time_allreduce(t, true, 1, 1);
    int iters = std::max(
        min_iters, static_cast<int>(target_seconds / std::max(probe, 1e-6)));
    iters = std::min(iters, 200);
    // Every rank must run the same number of iterations.
    at::Tensor it = at::full({1}, iters, at::kLong);
    ronde::allreduce_(it, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
    iters = static_cast<int>(it.item<int64_t>());
    double with_check = time_allreduce(t, true, warmup, iters);
    double without = time_allreduce(t, false, warmup, iters);
    double real_bytes = static_cast<double>(count) * 4;
    double algbw = real_bytes / with_check / 1e9;
    double busbw = algbw * bus_factor;
    if (rank == 0) {
      std::printf(
          "%12.0f %10.1f %10.3f %10.3f %10.1f %9.1f%%\n",
          real_bytes,
          with_check * 1e6,
          algbw,
          busbw,
          without * 1e6,
          100.0 * (with_check - without) / without);
      std::fflush(stdout);
    }
    json << (first ? "" : ",")
         << "{\"bytes\":" << static_cast<int64_t>(real_bytes)
         << ",\"iters\":" << iters << ",\"time_us\":" << with_check * 1e6
         << ",\"algbw_GBs\":" << algbw << ",\"busbw_GBs\":" << busbw
         << ",\"nocheck_time_us\":" << without * 1e6 << "}";
    first = false;
  }
  json << "]}";
  if (rank == 0 && !json_path.empty()) {
    std::ofstream(json_path) << json.str() << "\n";
  }
  ronde::shutdown();
  return 0;
}
