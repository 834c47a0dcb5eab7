// nccl-tests-style sweep over ronde's collectives. Run under ronderun:
// `ronderun -np 2 allreduce_bench -b 4K -e 256M -f 2 --json out.json`.
// --op picks the collective: allreduce (the default, in place, float32 sum),
// broadcast (in place, from rank 0), allgather (bytes / n per rank, bytes
// out), reducescatter (bytes in, bytes / n out, sum) or alltoall (bytes in
// and out, bytes / n to each rank). --into makes the last three write into
// an output kept across calls (allgather_into() and the others) instead of
// a new tensor per call. For each size:
// warm-up calls, then timed calls; the median is reported as time, algbw
// (bytes / time, bytes the larger of input and output) and busbw (algbw x
// 2(n-1)/n for allreduce, x 1 for broadcast, x (n-1)/n for allgather,
// reducescatter and alltoall, as nccl-tests defines them), with the cross-rank
// descriptor check on (the default) and off, so the check's cost is measured
// rather than guessed. --handoff times a third form: the async call and its
// wait, which goes through the communication thread where the blocking
// call runs on the caller's (queued_us: the cost of the hand-off).
// --loop N times N checked calls made back to back, as a training loop
// makes them, with no barrier between (loop_us, the mean per call).
//
// --arena makes the all-reduce's buffer, the reduce-scatter's input, or
// the all-gather's kept output (with --into), where the engine makes its
// gradient buckets (in shared memory, the rank's arena: reduced without a
// copy in, gathered without a copy out; docs/shared_memory.md, "Zero-copy
// buckets").
//
// --process-set runs the collective on a process set instead of the job:
// `all` (a set of every rank: its own communicator, the same transport) or
// `half` (the job in two halves, each running the sweep on its own set at
// once); sizes and bus factors then count the set's ranks.
//
// `allreduce_bench --memcpy -b 4K -e 256M` runs alone, without ronderun: the
// bandwidth of one thread's memcpy at each size of the sweep, the ceiling
// of a copy through shared memory, in the same JSON shape.
#include <ronde/ronde.h>

#include "comm/collective_calls.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

enum class Op { Allreduce, Broadcast, Allgather, Reducescatter, Alltoall };

const char* op_name(Op op) {
  switch (op) {
    case Op::Allreduce:
      return "allreduce";
    case Op::Broadcast:
      return "broadcast";
    case Op::Allgather:
      return "allgather";
    case Op::Reducescatter:
      return "reducescatter";
    case Op::Alltoall:
      return "alltoall";
  }
  return "?";
}

Op parse_op(const std::string& s) {
  for (Op op :
       {Op::Allreduce,
        Op::Broadcast,
        Op::Allgather,
        Op::Reducescatter,
        Op::Alltoall}) {
    if (s == op_name(op))
      return op;
  }
  throw std::invalid_argument(
      "--op: " + s +
      " (allreduce, broadcast, allgather, reducescatter, alltoall)");
}

const char* describe(Op op) {
  switch (op) {
    case Op::Allreduce:
      return "float32 sum, in place";
    case Op::Broadcast:
      return "float32, in place, root 0";
    case Op::Allgather:
      return "float32, bytes / n in per rank";
    case Op::Reducescatter:
      return "float32 sum, bytes / n out per rank";
    case Op::Alltoall:
      return "float32, bytes / n to each rank";
  }
  return "?";
}

// nccl-tests' busbw factor: what each link of a ring carries per byte of
// the collective. One rank: 1, busbw = algbw.
double bus_factor(Op op, int n) {
  if (n <= 1)
    return 1.0;
  switch (op) {
    case Op::Allreduce:
      return 2.0 * (n - 1) / n;
    case Op::Broadcast:
      return 1.0;
    case Op::Allgather:
    case Op::Reducescatter:
    case Op::Alltoall:
      return static_cast<double>(n - 1) / n;
  }
  return 1.0;
}

bool g_arena = false;  // --arena
// --into: allgather, reducescatter and alltoall write into an output kept
// across calls (the _into forms) instead of a new tensor per call.
bool g_into = false;
// The set the sweep runs on (--process-set); the job by default.
ronde::ProcessSet g_set;

// The tensor each rank passes for a sweep size of `bytes`: allgather gets
// bytes / n per rank, reducescatter a multiple of n elements (every rank
// then receives the same count). Sets *total to the bytes the collective
// moves, the larger of its input and output.
at::Tensor input_for(Op op, int64_t bytes, int n, int64_t* total) {
  int64_t count = bytes / 4;
  if (op == Op::Allgather) {
    int64_t per_rank = std::max<int64_t>(1, count / n);
    *total = per_rank * n * 4;
    return at::ones({per_rank});
  }
  if (op == Op::Reducescatter || op == Op::Alltoall)
    count = std::max<int64_t>(1, count / n) * n;
  *total = count * 4;
  if (g_arena && (op == Op::Allreduce || op == Op::Reducescatter))
    return ronde::detail::bucket_zeros(g_set, count, at::kFloat).fill_(1);
  return at::ones({count});
}

// One call of the collective, options built once, outside the timed region.
// `queued`: the async form and a wait, so that the call goes through the
// communication thread (a blocking call runs on the caller's thread).
std::function<void()> make_call(
    Op op, const at::Tensor& t, bool verify, bool queued = false) {
  switch (op) {
    case Op::Allreduce: {
      auto opts = ronde::AllreduceOptions()
                      .op(ronde::ReduceOp::Sum)
                      .verify(verify)
                      .process_set(g_set);
      if (queued)
        return [t, opts] { ronde::allreduce_async_(t, opts).wait(); };
      return [t, opts] { ronde::allreduce_(t, opts); };
    }
    case Op::Broadcast: {
      auto opts = ronde::CollectiveOptions().verify(verify).process_set(g_set);
      if (queued)
        return [t, opts] { ronde::broadcast_async_(t, 0, opts).wait(); };
      return [t, opts] { ronde::broadcast_(t, 0, opts); };
    }
    case Op::Allgather: {
      auto opts = ronde::CollectiveOptions().verify(verify).process_set(g_set);
      if (g_into) {
        const int64_t n = t.numel() * g_set.size();
        at::Tensor out = g_arena
                             ? ronde::detail::bucket_zeros(g_set, n, at::kFloat)
                             : at::empty({n});
        if (queued)
          return [t, out, opts] {
            ronde::allgather_into_async(t, out, opts).wait();
          };
        return [t, out, opts] { ronde::allgather_into(t, out, opts); };
      }
      if (queued)
        return [t, opts] { ronde::allgather_async(t, opts).wait(); };
      return [t, opts] { ronde::allgather(t, opts); };
    }
    case Op::Reducescatter: {
      auto opts = ronde::ReducescatterOptions()
                      .op(ronde::ReduceOp::Sum)
                      .verify(verify)
                      .process_set(g_set);
      if (g_into) {
        at::Tensor out = at::empty({t.numel() / g_set.size()});
        if (queued)
          return [t, out, opts] {
            ronde::reducescatter_into_async(t, out, opts).wait();
          };
        return [t, out, opts] { ronde::reducescatter_into(t, out, opts); };
      }
      if (queued)
        return [t, opts] { ronde::reducescatter_async(t, opts).wait(); };
      return [t, opts] { ronde::reducescatter(t, opts); };
    }
    case Op::Alltoall: {
      auto opts = ronde::AlltoallOptions().verify(verify).process_set(g_set);
      if (g_into) {
        at::Tensor out = at::empty_like(t);
        if (queued)
          return [t, out, opts] {
            ronde::alltoall_into_async(t, out, opts).wait();
          };
        return [t, out, opts] { ronde::alltoall_into(t, out, opts); };
      }
      if (queued)
        return [t, opts] { ronde::alltoall_async(t, opts).wait(); };
      return [t, opts] { ronde::alltoall(t, opts); };
    }
  }
  throw std::logic_error("unknown op");
}

// Median seconds of one call, timed between barriers so that every rank
// measures the same collective.
// The 90th percentile of one call's seconds in the last time_collective(),
// the largest over ranks: the tail the median hides on a shared machine.
double g_last_p90 = 0.0;

double time_collective(
    const std::function<void()>& call, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i)
    call();
  std::vector<double> samples;
  for (int i = 0; i < iters; ++i) {
    ronde::barrier(g_set);
    auto t0 = std::chrono::steady_clock::now();
    call();
    samples.push_back(seconds_since(t0));
  }
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  const double p90 = sorted[std::min(
      sorted.size() - 1, static_cast<size_t>(0.9 * sorted.size()))];
  // Every rank reports rank 0's clock: take the max over ranks of the median.
  at::Tensor m = at::tensor({median(samples), p90}, at::kDouble);
  ronde::allreduce_(m, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
  g_last_p90 = m[1].item<double>();
  return m[0].item<double>();
}

// Mean seconds of one call over `calls` made back to back after a barrier,
// as a training loop makes them, the largest over ranks.
double time_loop(const std::function<void()>& call, int calls) {
  for (int i = 0; i < 10; ++i)
    call();
  ronde::barrier(g_set);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i)
    call();
  at::Tensor m = at::full({1}, seconds_since(t0) / calls, at::kDouble);
  ronde::allreduce_(m, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
  return m.item<double>();
}

struct Sweep {
  int64_t begin = 4 << 10, end = 256 << 20;
  double factor = 2;
  int warmup = 3, min_iters = 5;
  double target_seconds = 0.5;  // per size and mode, beyond min_iters
  std::string json_path;
  std::string process_set = "global";  // or "all", "half"
  bool handoff = false;  // also time the queued (async + wait) form
  int loop = 0;          // also time this many calls back to back (mean)
};

struct AlignedFree {
  void operator()(void* p) const {
    std::free(p);
  }
};

// 64-byte aligned, like LibTorch's CPU tensors, and every page touched.
std::unique_ptr<unsigned char, AlignedFree> touched_buffer(
    int64_t bytes, int fill) {
  size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  auto* p = static_cast<unsigned char*>(std::aligned_alloc(64, size));
  if (!p)
    throw std::bad_alloc();
  std::memset(p, fill, size);
  return std::unique_ptr<unsigned char, AlignedFree>(p);
}

// Keeps the compiler from dropping or merging copies whose result is not
// read.
void clobber_memory() {
  asm volatile("" : : : "memory");
}

// Single-thread std::memcpy between two distinct, pre-touched buffers at
// each size of the sweep. A sample times enough copies for about 10 us (one
// copy of a small buffer is below the clock's resolution); the median
// sample, per copy, is reported, with busbw = algbw = bytes / time.
int run_memcpy(const Sweep& s) {
  std::ostringstream json;
  json << "{\"benchmark\":\"allreduce\",\"impl\":\"memcpy\",\"op\":\"memcpy\","
       << "\"ranks\":1,\"dtype\":\"float32\",\"results\":[";
  std::printf("# memcpy, one thread, distinct pre-touched buffers, median\n");
  std::printf(
      "%12s %10s %10s %8s %6s\n", "bytes", "time_us", "GBs", "samples", "reps");
  bool first = true;
  for (double b = static_cast<double>(s.begin); b <= s.end; b *= s.factor) {
    int64_t bytes = static_cast<int64_t>(b) / 4 * 4;
    auto src = touched_buffer(bytes, 1);
    auto dst = touched_buffer(bytes, 0);
    auto copy = [&] {
      std::memcpy(dst.get(), src.get(), bytes);
      clobber_memory();
    };
    for (int i = 0; i < std::max(s.warmup, 1); ++i)
      copy();
    auto t0 = std::chrono::steady_clock::now();
    copy();
    double probe = std::max(seconds_since(t0), 1e-9);
    int reps = std::min(1000, std::max(1, static_cast<int>(10e-6 / probe)));
    int iters = std::max(
        s.min_iters, static_cast<int>(s.target_seconds / (probe * reps)));
    iters = std::min(iters, 200);
    std::vector<double> samples;
    for (int i = 0; i < iters; ++i) {
      t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r)
        copy();
      samples.push_back(seconds_since(t0) / reps);
    }
    double sec = median(samples);
    double gbs = static_cast<double>(bytes) / sec / 1e9;
    std::printf(
        "%12lld %10.2f %10.3f %8d %6d\n",
        static_cast<long long>(bytes),
        sec * 1e6,
        gbs,
        iters,
        reps);
    std::fflush(stdout);
    json << (first ? "" : ",") << "{\"bytes\":" << bytes
         << ",\"iters\":" << iters << ",\"reps\":" << reps
         << ",\"time_us\":" << sec * 1e6 << ",\"algbw_GBs\":" << gbs
         << ",\"busbw_GBs\":" << gbs << "}";
    first = false;
  }
  json << "]}";
  if (!s.json_path.empty())
    std::ofstream(s.json_path) << json.str() << "\n";
  return 0;
}

int run_collective(Op op, const Sweep& s) {
  at::set_num_threads(1);
  ronde::init();
  const int rank = ronde::rank();
  if (s.process_set == "all") {
    std::vector<int> all(ronde::size());
    for (int r = 0; r < ronde::size(); ++r)
      all[r] = r;
    g_set = ronde::add_process_set(all);
  } else if (s.process_set == "half") {
    std::vector<int> low, high;
    for (int r = 0; r < ronde::size(); ++r)
      (r < ronde::size() / 2 ? low : high).push_back(r);
    ronde::ProcessSet a = ronde::add_process_set(low);
    ronde::ProcessSet b = ronde::add_process_set(high);
    g_set = a.included() ? a : b;
  }
  const int n = g_set.size();
  const double factor = bus_factor(op, n);
  const std::string backend = ronde::host_backend();
  const bool reduces = op == Op::Allreduce || op == Op::Reducescatter;
  std::ostringstream json;
  json << "{\"benchmark\":\"allreduce\",\"impl\":\"ronde\",\"op\":\""
       << op_name(op) << "\",\"ranks\":" << n
       << ",\"job_ranks\":" << ronde::size() << ",\"process_set\":\""
       << s.process_set << "\",\"dtype\":\"float32\""
       << ",\"arena\":" << (g_arena ? "true" : "false")
       << ",\"into\":" << (g_into ? "true" : "false");
  if (reduces)
    json << ",\"reduce_op\":\"sum\"";
  if (op == Op::Broadcast)
    json << ",\"root\":0";
  json << ",\"backend\":\"" << backend << "\",\"results\":[";
  if (rank == 0) {
    std::printf(
        "# ronde %s, %d ranks, %s, over %s%s%s, median\n",
        op_name(op),
        n,
        describe(op),
        backend.c_str(),
        g_arena ? ", buffer in the arena" : "",
        g_into ? ", into a kept output" : "");
    std::printf(
        "%12s %10s %10s %10s %10s %10s",
        "bytes",
        "time_us",
        "algbw_GBs",
        "busbw_GBs",
        "nocheck_us",
        "check_cost");
    if (s.handoff)
      std::printf(" %10s", "queued_us");
    if (s.loop > 0)
      std::printf(" %10s", "loop_us");
    std::printf("\n");
  }
  bool first = true;
  for (double b = static_cast<double>(s.begin); b <= s.end; b *= s.factor) {
    int64_t total = 0;
    at::Tensor t = input_for(op, static_cast<int64_t>(b), n, &total);
    auto checked = make_call(op, t, true);
    auto unchecked = make_call(op, t, false);
    // Enough iterations for about target_seconds, never fewer than min_iters.
    double probe = time_collective(checked, 1, 1);
    int iters = std::max(
        s.min_iters,
        static_cast<int>(s.target_seconds / std::max(probe, 1e-6)));
    iters = std::min(iters, 200);
    // Every rank must run the same number of iterations.
    at::Tensor it = at::full({1}, iters, at::kLong);
    ronde::allreduce_(it, ronde::AllreduceOptions().op(ronde::ReduceOp::Max));
    iters = static_cast<int>(it.item<int64_t>());
    double with_check = time_collective(checked, s.warmup, iters);
    const double p90 = g_last_p90;
    double without = time_collective(unchecked, s.warmup, iters);
    const double queued =
        s.handoff
            ? time_collective(make_call(op, t, true, true), s.warmup, iters)
            : 0.0;
    const double loop = s.loop > 0 ? time_loop(checked, s.loop) : 0.0;
    double real_bytes = static_cast<double>(total);
    double algbw = real_bytes / with_check / 1e9;
    double busbw = algbw * factor;
    if (rank == 0) {
      std::printf(
          "%12.0f %10.1f %10.3f %10.3f %10.1f %9.1f%%",
          real_bytes,
          with_check * 1e6,
          algbw,
          busbw,
          without * 1e6,
          100.0 * (with_check - without) / without);
      if (s.handoff)
        std::printf(" %10.1f", queued * 1e6);
      if (s.loop > 0)
        std::printf(" %10.2f", loop * 1e6);
      std::printf("\n");
      std::fflush(stdout);
    }
    json << (first ? "" : ",") << "{\"bytes\":" << total
         << ",\"iters\":" << iters << ",\"time_us\":" << with_check * 1e6
         << ",\"p90_time_us\":" << p90 * 1e6 << ",\"algbw_GBs\":" << algbw
         << ",\"busbw_GBs\":" << busbw
         << ",\"nocheck_time_us\":" << without * 1e6;
    if (s.handoff)
      json << ",\"queued_time_us\":" << queued * 1e6;
    if (s.loop > 0)
      json << ",\"loop_time_us\":" << loop * 1e6;
    json << "}";
    first = false;
  }
  json << "]}";
  if (rank == 0 && !s.json_path.empty()) {
    std::ofstream(s.json_path) << json.str() << "\n";
  }
  ronde::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Sweep s;
  Op op = Op::Allreduce;
  bool memcpy_mode = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc)
          throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "-b")
        s.begin = parse_size(next());
      else if (a == "-e")
        s.end = parse_size(next());
      else if (a == "-f")
        s.factor = std::stod(next());
      else if (a == "-w")
        s.warmup = std::stoi(next());
      else if (a == "-n")
        s.min_iters = std::stoi(next());
      else if (a == "--json")
        s.json_path = next();
      else if (a == "--op")
        op = parse_op(next());
      else if (a == "--memcpy")
        memcpy_mode = true;
      else if (a == "--process-set")
        s.process_set = next();
      else if (a == "--handoff")
        s.handoff = true;
      else if (a == "--arena")
        g_arena = true;
      else if (a == "--into")
        g_into = true;
      else if (a == "--loop")
        s.loop = std::stoi(next());
      else
        throw std::invalid_argument("unknown argument " + a);
    }
    if (s.begin < 4 || s.factor <= 1)
      throw std::invalid_argument("-b must be at least 4 and -f above 1");
    if (s.process_set != "global" && s.process_set != "all" &&
        s.process_set != "half")
      throw std::invalid_argument("--process-set: global, all or half");
  } catch (const std::exception& e) {
    std::cerr << "allreduce_bench: " << e.what() << "\n"
              << "usage: allreduce_bench [-b 4K] [-e 256M] [-f 2] [-w 3] "
                 "[-n 5] [--json FILE] [--handoff] [--loop N] [--arena]\n"
                 "                       [--into] [--op allreduce|broadcast|"
                 "allgather|reducescatter|alltoall | --memcpy]\n"
                 "                       [--process-set global|all|half]\n";
    return 2;
  }
  return memcpy_mode ? run_memcpy(s) : run_collective(op, s);
}
