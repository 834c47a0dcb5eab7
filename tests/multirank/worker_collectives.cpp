// Scenarios of the collectives on the whole job: every collective against
// the reference (collectives), a digest of sums for comparing algorithms
// across jobs (digest), calls whose arguments differ between ranks
// (mismatch), and all-reduces repeated until their check carries them
// (fused).
#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/runtime.h>
#include <ronde/timeline.h>

#include "comm/collective_calls.h"
#include "scenario_registry.h"
#include "worker_checks.h"
#include "worker_reference.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace ronde::testing;

RONDE_SCENARIO(collectives) {
  ronde::init();
  // Whichever launcher convention started this rank.
  const char* size_env = nullptr;
  const char* rank_env = nullptr;
  for (auto [size_var, rank_var] :
       {std::pair{"RONDE_SIZE", "RONDE_RANK"},
        std::pair{"WORLD_SIZE", "RANK"},
        std::pair{"SLURM_NTASKS", "SLURM_PROCID"}}) {
    const char* v = std::getenv(size_var);
    if (size_env == nullptr && v != nullptr && *v != '\0') {
      size_env = v;
      rank_env = std::getenv(rank_var);
    }
  }
  bool launched = size_env != nullptr;
  CHECK_W(ronde::size() == (launched ? std::atoi(size_env) : 1), "size");
  CHECK_W(ronde::rank() == (launched ? std::atoi(rank_env) : 0), "rank");
  CHECK_W(ronde::device() == c10::Device(c10::kCPU), "device");
  std::cout << "HOST_BACKEND: " << ronde::host_backend() << std::endl;
  std::cout << "TOPOLOGY: " << ronde::local_rank() << " " << ronde::local_size()
            << " " << ronde::cross_rank() << " " << ronde::cross_size()
            << std::endl;
  check_allreduce();
  check_allgather();
  check_broadcast();
  check_alltoall();
  check_reducescatter();
  check_into();
  check_async();
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Sums of random floating tensors (below, across and far beyond a chunk)
// and a digest of their bits: the test compares digests across ranks, and
// across jobs that reduce by different algorithms.
RONDE_SCENARIO(digest) {
  ronde::init();
  const int me = ronde::rank();
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  int64_t seed = 7;
  for (auto dtype : kFloatTypes) {
    // The largest goes through the hierarchical all-reduce's pipeline in
    // 8 MiB pieces: float in two (the second short), double in three (a
    // one-element tail joined to the last), 16-bit types whole.
    for (int64_t count :
         {int64_t{5}, int64_t{3000}, int64_t{300001}, int64_t{3145729}}) {
      at::Tensor got = ronde::allreduce(
          input_for(me, ++seed, {count}, dtype),
          ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
      CHECK_W(
          close_sum(got, ronde::size(), seed, {count}, dtype),
          "digest sum ",
          dtype,
          " ",
          count);
      const auto* p = static_cast<const uint8_t*>(got.data_ptr());
      for (size_t i = 0; i < got.nbytes(); ++i)
        h = (h ^ p[i]) * 1099511628211ull;
    }
  }
  std::cout << "DIGEST: " << std::hex << h << std::dec << std::endl;
  std::cout << "HOST_BACKEND: " << ronde::host_backend() << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

RONDE_SCENARIO(mismatch) {
  ronde::init();
  const int me = ronde::rank();
  // The shape differs on the last rank.
  auto shape_mismatch = [&](const std::string& name) {
    expect_error(
        [&] {
          int64_t cols = me == ronde::size() - 1 ? 6 : 5;
          ronde::allreduce(
              at::ones({4, cols}), ronde::AllreduceOptions().name(name));
        },
        {"disagree", "'" + name + "'", "Float[4, 5]", "Float[4, 6]"});
  };
  // Calls every rank made before are checked by their fingerprints alone
  // (the full descriptors travel only for a first call): both shapes below
  // are known everywhere, so only the fingerprints can tell the ranks
  // apart, and they must, on every rank.
  for (int64_t cols : {5, 6}) {
    for (int i = 0; i < 3; ++i)
      ronde::allreduce(
          at::ones({4, cols}), ronde::AllreduceOptions().name("known"));
  }
  shape_mismatch("known");
  // A bad argument on one rank only (rank 1's splits) is reported on every
  // rank.
  const int n = ronde::size();
  auto bad_splits = [&](const std::string& name) {
    expect_error(
        [&] {
          std::vector<int64_t> splits(n, 1);
          if (me == 1)
            splits[0] = 5;
          ronde::alltoall(
              at::ones({n}),
              ronde::AlltoallOptions().splits(splits).name(name));
        },
        {"rejected", "rank 1: splits sum to"});
  };
  // A complaint about a call seen before is still every rank's error.
  for (int i = 0; i < 2; ++i) {
    ronde::alltoall(
        at::ones({n}),
        ronde::AlltoallOptions()
            .splits(std::vector<int64_t>(n, 1))
            .name("known"));
  }
  bad_splits("known");
  // A first call with that mismatch.
  shape_mismatch("weights");
  // Op differs.
  expect_error(
      [&] {
        ronde::allreduce(
            at::ones({3}),
            ronde::AllreduceOptions().op(
                me == 0 ? ronde::ReduceOp::Sum : ronde::ReduceOp::Max));
      },
      {"disagree", "allreduce(sum)", "allreduce(max)"});
  // Dtype differs.
  expect_error(
      [&] {
        ronde::allreduce(at::ones({3}, me == 0 ? at::kFloat : at::kDouble));
      },
      {"disagree", "Float[3]", "Double[3]"});
  // Root differs.
  expect_error(
      [&] { ronde::broadcast(at::ones({3}), me == 0 ? 0 : 1); },
      {"disagree", "root 0", "root 1"});
  // Different collectives altogether.
  expect_error(
      [&] {
        if (me == 0) {
          ronde::allgather(at::ones({2}));
        } else {
          ronde::allreduce(at::ones({2}));
        }
      },
      {"disagree", "allgather", "allreduce"});
  // Allgather: dims beyond 0 must agree.
  expect_error(
      [&] {
        ronde::allgather(at::ones({2, me + 1}));
      },
      {"disagree", "allgather"});
  // The same about a first call.
  bad_splits("bad");
  expect_error(
      [&] { ronde::allreduce(at::ones({2}, at::kInt)); },
      {"average of integer tensors"});
  expect_error([&] { ronde::broadcast(at::ones({2}), 99); }, {"root rank 99"});
  // A bad `out` on one rank fails the _into forms on every rank.
  expect_error(
      [&] {
        at::Tensor out = at::empty({2, 3}, me == 1 ? at::kDouble : at::kFloat);
        ronde::reducescatter_into(at::ones({2 * n, 3}), out);
      },
      {"rejected", "rank 1: out is Double, the input Float"});
  expect_error(
      [&] {
        at::Tensor out = at::empty({me == 0 ? 3 : 2, 3});
        ronde::reducescatter_into(at::ones({2 * n, 3}), out);
      },
      {"rejected", "rank 0: out has 3 rows, this rank's part 2"});
  expect_error(
      [&] {
        at::Tensor x = at::ones({n, 2});
        ronde::alltoall_into(x, me == 1 ? x : at::empty({n, 2}));
      },
      {"rejected", "rank 1: out overlaps the input"});
  expect_error(
      [&] {
        ronde::allgather_into(
            at::ones({1, 3}),
            me == 1 ? at::empty({3, n}).t() : at::empty({n, 3}));
      },
      {"rejected", "rank 1: out is not contiguous"});
  // Rows that arrive otherwise than `out` holds fail on that rank alone,
  // with `out` as it was; the others get the result.
  {
    at::Tensor x = at::full({2, 3}, static_cast<float>(me));
    at::Tensor out = at::full({2 * n + (me == 0 ? 1 : 0), 3}, -1.0f);
    if (me == 0) {
      expect_error(
          [&] { ronde::allgather_into(x, out); },
          {"on rank 0: out has " + std::to_string(2 * n + 1) + " rows, but " +
           std::to_string(2 * n) + " came; out is left as it was"});
      CHECK_W(out.eq(-1).all().item<bool>(), "a failed allgather_into wrote");
    } else {
      ronde::allgather_into(x, out);
      at::Tensor want = at::arange(n, at::kFloat)
                            .repeat_interleave(2)
                            .unsqueeze(1)
                            .expand({2 * n, 3});
      CHECK_W(at::equal(out, want), "allgather_into beside a failed one");
    }
  }
  // The communicator is still healthy afterwards.
  at::Tensor got = ronde::allreduce(
      at::ones({3}) * (me + 1),
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(
      at::allclose(got, at::full({3}, n * (n + 1) / 2.0)),
      "allreduce after mismatches");
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// How many of the timeline's all-reduces (named `name`, when given) rode in
// their check's step: one event per line.
int fused_calls(const std::string& trace, const std::string& name = "") {
  const std::string wanted =
      "\"name\":\"allreduce " + (name.empty() ? "" : name + "\"");
  std::ifstream in(trace);
  int fused = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find(wanted) != std::string::npos &&
        line.find("\"fused\":true") != std::string::npos)
      ++fused;
  }
  return fused;
}

// Each all-reduce three times under one name, so that from the second call
// its check may carry it (Communicator::exchange_frames): against the
// reference and, over shared memory, bitwise against the same inputs
// reduced unchecked (the backend's own all-reduce). Prints how many calls
// the timeline saw fused.
RONDE_SCENARIO(fused) {
  ronde::init();
  const int n = ronde::size(), me = ronde::rank();
  // Shared memory and a one-rank job reduce in the check's step, in the
  // order an unchecked call does.
  const bool on_shm =
      ronde::host_backend() == "shm" || ronde::host_backend() == "self";
  ronde::start_timeline(
      std::string(std::getenv("FUSED_TRACE_DIR")) + "/trace.{rank}.json");
  const std::string trace = ronde::timeline_path();
  std::vector<at::ScalarType> types = kFloatTypes;
  types.insert(types.end(), kIntTypes.begin(), kIntTypes.end());
  int64_t seed = 100;
  for (auto dtype : types) {
    for (auto op :
         {ronde::ReduceOp::Sum,
          ronde::ReduceOp::Average,
          ronde::ReduceOp::Min,
          ronde::ReduceOp::Max,
          ronde::ReduceOp::Product}) {
      if (!at::isFloatingType(dtype) && op == ronde::ReduceOp::Average)
        continue;
      // Within and beyond what a 4 KiB chunk carries beside a frame.
      for (int64_t count :
           {int64_t{1}, int64_t{7}, int64_t{500}, int64_t{3000}}) {
        for (int i = 0; i < 3; ++i) {
          ++seed;
          at::Tensor x = input_for(me, seed, {count}, dtype);
          auto o = ronde::AllreduceOptions().op(op).name("fused");
          at::Tensor got = ronde::allreduce(x, o);
          CHECK_W(
              close(got, reference_reduce(n, seed, {count}, dtype, op)),
              "fused ",
              ronde::to_string(op),
              " ",
              dtype,
              " ",
              count);
          // (Over Gloo the unchecked call reduces in another order.)
          if (on_shm) {
            at::Tensor plain = ronde::allreduce(x, o.verify(false));
            CHECK_W(
                at::equal(got, plain),
                "fused and unchecked differ: ",
                ronde::to_string(op),
                " ",
                dtype,
                " ",
                count);
          }
        }
      }
    }
  }
  // In place, with a postscale (carried) and with a prescale (not).
  for (double pre : {1.0, 0.5}) {
    for (int i = 0; i < 3; ++i) {
      at::Tensor x = at::full({100}, me + 1.0);
      ronde::allreduce_(
          x,
          ronde::AllreduceOptions()
              .op(ronde::ReduceOp::Sum)
              .name("scaled")
              .prescale_factor(pre)
              .postscale_factor(2.0));
      CHECK_W(at::equal(x, at::full({100}, pre * n * (n + 1))), "scaled ", pre);
    }
  }
  ronde::stop_timeline();
  std::cout << "FUSED_CALLS: " << fused_calls(trace) << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// A repeated all-reduce of a buffer in the shared-memory arena (where the
// engine makes its buckets) is read in place after its check, not copied
// into the check's step; a plain tensor of the same size rides there.
// Both against the reference; prints how many of each the timeline saw
// fused.
RONDE_SCENARIO(fused_arena) {
  ronde::init();
  const int n = ronde::size(), me = ronde::rank();
  ronde::start_timeline(
      std::string(std::getenv("FUSED_TRACE_DIR")) + "/trace.{rank}.json");
  const std::string trace = ronde::timeline_path();
  const int64_t count = 4096;  // 16 KiB: within the check's step
  const at::Tensor arena = ronde::detail::bucket_zeros(
      ronde::global_process_set(), count, at::kFloat);
  int64_t seed = 700;
  for (const std::string name : {"arena", "plain"}) {
    for (int i = 0; i < 3; ++i) {
      ++seed;
      const at::Tensor x = input_for(me, seed, {count}, at::kFloat);
      at::Tensor buf = name == "arena" ? arena : at::empty_like(x);
      buf.copy_(x);
      ronde::allreduce_(
          buf, ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).name(name));
      CHECK_W(
          close(
              buf,
              reference_reduce(
                  n, seed, {count}, at::kFloat, ronde::ReduceOp::Sum)),
          name,
          " call ",
          i);
    }
  }
  ronde::stop_timeline();
  std::cout << "ARENA_FUSED: " << fused_calls(trace, "arena")
            << " PLAIN_FUSED: " << fused_calls(trace, "plain") << std::endl;
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

}  // namespace
