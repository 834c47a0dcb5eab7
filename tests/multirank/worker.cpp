// The program the multirank tests start N times. argv[1] names a scenario;
// each scenario computes, on every rank, the expected result of every
// collective from the inputs all ranks generate deterministically, and
// exits non-zero with a message at the first difference.
#include <ronde/ronde.h>

#include "worker_checks.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>

namespace {

using ronde::testing::expect_error;

// Exact comparison for integers and for reductions whose order does not
// matter; a tolerance for float sums reduced in ring order.
bool close(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes()) || a.scalar_type() != b.scalar_type()) {
    return false;
  }
  if (at::isFloatingType(a.scalar_type())) {
    double tol =
        a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16 ? 2e-2
                                                                         : 1e-5;
    return at::allclose(a.to(at::kDouble), b.to(at::kDouble), tol, tol, true);
  }
  return at::equal(a, b);
}

// Rank r's input for a collective: deterministic in (r, seed, shape).
at::Tensor input_for(
    int r, int64_t seed, at::IntArrayRef shape, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 131 + r);
  if (at::isFloatingType(dtype)) {
    return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat))
        .to(dtype);
  }
  // Small values keep integer products and sums in range.
  return at::randint(1, 4, shape, gen, at::TensorOptions().dtype(at::kLong))
      .to(dtype);
}

at::Tensor reference_reduce(
    int n,
    int64_t seed,
    at::IntArrayRef shape,
    at::ScalarType dtype,
    ronde::ReduceOp op) {
  // Reduce in double/long so the reference is not itself rounded per step,
  // then cast to the tensor's dtype.
  auto wide = at::isFloatingType(dtype) ? at::kDouble : at::kLong;
  at::Tensor acc = input_for(0, seed, shape, dtype).to(wide);
  for (int r = 1; r < n; ++r) {
    at::Tensor x = input_for(r, seed, shape, dtype).to(wide);
    switch (op) {
      case ronde::ReduceOp::Sum:
      case ronde::ReduceOp::Average:
        acc = acc + x;
        break;
      case ronde::ReduceOp::Min:
        acc = at::minimum(acc, x);
        break;
      case ronde::ReduceOp::Max:
        acc = at::maximum(acc, x);
        break;
      case ronde::ReduceOp::Product:
        acc = acc * x;
        break;
    }
  }
  if (op == ronde::ReduceOp::Average)
    acc = acc / n;
  return acc.to(dtype);
}

// A sum against its exact value, within what rounding allows: each of the
// at most n-1 roundings of a partial sum (16-bit types: in Gloo's ring, or
// between the stages of the hierarchical all-reduce) errs by at most the
// unit roundoff times that partial sum, which is bounded by the sum of the
// inputs' magnitudes (one more rounding: the reference's own cast); a
// fixed tolerance on the result alone fails where large partial sums
// cancel.
bool close_sum(
    const at::Tensor& got,
    int n,
    int64_t seed,
    at::IntArrayRef shape,
    at::ScalarType dtype) {
  at::Tensor want =
      reference_reduce(n, seed, shape, dtype, ronde::ReduceOp::Sum)
          .to(at::kDouble);
  at::Tensor magnitude = at::zeros(shape, at::kDouble);
  for (int r = 0; r < n; ++r)
    magnitude += input_for(r, seed, shape, dtype).to(at::kDouble).abs();
  const double u = dtype == at::kBFloat16 ? 1.0 / 256
      : dtype == at::kHalf                ? 1.0 / 2048
                                          : 1e-6;
  at::Tensor err = (got.to(at::kDouble) - want).abs();
  return got.sizes().equals(shape) && got.scalar_type() == dtype &&
      at::all(err <= 1e-5 + n * u * magnitude).item<bool>();
}

const std::vector<at::ScalarType> kFloatTypes = {
    at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
const std::vector<at::ScalarType> kIntTypes = {
    at::kChar, at::kByte, at::kShort, at::kInt, at::kLong};

void check_allreduce(const ronde::ProcessSet& ps = {}) {
  const int n = ps.size(), me = ps.rank();
  int64_t seed = 1;
  std::vector<ronde::ReduceOp> ops = {
      ronde::ReduceOp::Sum,
      ronde::ReduceOp::Average,
      ronde::ReduceOp::Min,
      ronde::ReduceOp::Max,
      ronde::ReduceOp::Product};
  std::vector<at::ScalarType> types = kFloatTypes;
  types.insert(types.end(), kIntTypes.begin(), kIntTypes.end());
  for (auto dtype : types) {
    for (auto op : ops) {
      bool is_int = !at::isFloatingType(dtype);
      if (is_int && op == ronde::ReduceOp::Average)
        continue;
      for (std::vector<int64_t> shape :
           {std::vector<int64_t>{0},
            std::vector<int64_t>{7},
            // 4 KiB of float32: the most a call carries in its check.
            std::vector<int64_t>{1024},
            std::vector<int64_t>{33, 65}}) {
        ++seed;
        at::Tensor x = input_for(me, seed, shape, dtype);
        at::Tensor before = x.clone();
        at::Tensor got = ronde::allreduce(
            x,
            ronde::AllreduceOptions().process_set(ps).op(op).name(
                "t" + std::to_string(seed)));
        at::Tensor want = reference_reduce(n, seed, shape, dtype, op);
        CHECK_W(
            close(got, want),
            "allreduce ",
            ronde::to_string(op),
            " ",
            dtype,
            " ",
            shape);
        CHECK_W(at::equal(x, before), "allreduce changed its input");
        // In place, on a non-contiguous view.
        at::Tensor base = input_for(me, seed, {shape[0], 2}, dtype);
        at::Tensor col = base.select(1, 0);
        at::Tensor col_before = base.select(1, 1).clone();
        if (shape.size() == 1) {
          at::Tensor col_input = col.clone();
          ronde::allreduce_(
              col, ronde::AllreduceOptions().process_set(ps).op(op));
          auto wide_ref = [&] {
            // Reference for the column: reduce every rank's column.
            auto w = at::isFloatingType(dtype) ? at::kDouble : at::kLong;
            at::Tensor acc;
            for (int r = 0; r < n; ++r) {
              at::Tensor c =
                  input_for(r, seed, {shape[0], 2}, dtype).select(1, 0).to(w);
              if (r == 0) {
                acc = c;
                continue;
              }
              switch (op) {
                case ronde::ReduceOp::Sum:
                case ronde::ReduceOp::Average:
                  acc = acc + c;
                  break;
                case ronde::ReduceOp::Min:
                  acc = at::minimum(acc, c);
                  break;
                case ronde::ReduceOp::Max:
                  acc = at::maximum(acc, c);
                  break;
                case ronde::ReduceOp::Product:
                  acc = acc * c;
                  break;
              }
            }
            if (op == ronde::ReduceOp::Average)
              acc = acc / n;
            return acc.to(dtype);
          }();
          CHECK_W(close(col.contiguous(), wide_ref), "allreduce_ view ", dtype);
          CHECK_W(
              at::equal(base.select(1, 1), col_before),
              "allreduce_ touched the other column");
        }
      }
    }
  }
  // Prescale and postscale.
  at::Tensor x = input_for(me, 999, {10}, at::kFloat);
  at::Tensor got = ronde::allreduce(
      x,
      ronde::AllreduceOptions()
          .process_set(ps)
          .op(ronde::ReduceOp::Sum)
          .prescale_factor(0.5)
          .postscale_factor(3.0));
  at::Tensor want =
      reference_reduce(n, 999, {10}, at::kFloat, ronde::ReduceOp::Sum) * 1.5;
  CHECK_W(close(got, want), "prescale/postscale");
}

void check_allgather(const ronde::ProcessSet& ps = {}) {
  const int n = ps.size(), me = ps.rank();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong, at::kByte}) {
    // Dim 0 differs per rank (rank 1 sends nothing).
    int64_t rows = me == 1 ? 0 : me + 2;
    at::Tensor x = input_for(me, 5, {rows, 3}, dtype);
    at::Tensor got = ronde::allgather(
        x, ronde::CollectiveOptions().process_set(ps).name("g"));
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n; ++r) {
      parts.push_back(input_for(r, 5, {r == 1 ? 0 : r + 2, 3}, dtype));
    }
    CHECK_W(at::equal(got, at::cat(parts, 0)), "allgather ", dtype);
  }
  // Rank 0's part too large to travel with the check, the others' not.
  auto rows_of = [](int r) { return r == 0 ? int64_t{400} : int64_t{r}; };
  at::Tensor x = input_for(me, 6, {rows_of(me), 3}, at::kFloat);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r)
    parts.push_back(input_for(r, 6, {rows_of(r), 3}, at::kFloat));
  CHECK_W(
      at::equal(
          ronde::allgather(x, ronde::CollectiveOptions().process_set(ps)),
          at::cat(parts, 0)),
      "allgather mixed");
}

void check_broadcast(const ronde::ProcessSet& ps = {}) {
  const int n = ps.size(), me = ps.rank();
  for (int root = 0; root < n; ++root) {
    for (auto dtype : {at::kFloat, at::kHalf, at::kInt}) {
      // Small and large: carried by the check, or broadcast after it.
      const int64_t rows = dtype == at::kHalf ? 400 : 4;
      at::Tensor x = input_for(me, 40 + root, {rows, 5}, dtype);
      at::Tensor want = input_for(root, 40 + root, {rows, 5}, dtype);
      at::Tensor got =
          ronde::broadcast(x, root, ronde::CollectiveOptions().process_set(ps));
      CHECK_W(at::equal(got, want), "broadcast root ", root);
      CHECK_W(
          at::equal(x, input_for(me, 40 + root, {rows, 5}, dtype)),
          "out-of-place broadcast changed its input");
      ronde::broadcast_(x, root, ronde::CollectiveOptions().process_set(ps));
      CHECK_W(at::equal(x, want), "broadcast_ root ", root);
    }
  }
}

void check_alltoall(const ronde::ProcessSet& ps = {}) {
  const int n = ps.size(), me = ps.rank();
  // Rank r sends (r + d) % 3 rows to rank d.
  auto splits_of = [&](int r) {
    std::vector<int64_t> s;
    for (int d = 0; d < n; ++d)
      s.push_back((r + d) % 3);
    return s;
  };
  auto rows_of = [&](int r) {
    int64_t t = 0;
    for (auto v : splits_of(r))
      t += v;
    return t;
  };
  for (auto dtype : {at::kFloat, at::kLong}) {
    at::Tensor x = input_for(me, 77, {rows_of(me), 2}, dtype);
    auto h = ronde::alltoall_async(
        x, ronde::AlltoallOptions().process_set(ps).splits(splits_of(me)));
    at::Tensor got = h.result();
    std::vector<at::Tensor> parts;
    std::vector<int64_t> want_splits;
    for (int r = 0; r < n; ++r) {
      at::Tensor src = input_for(r, 77, {rows_of(r), 2}, dtype);
      auto s = splits_of(r);
      int64_t offset = 0;
      for (int d = 0; d < me; ++d)
        offset += s[d];
      parts.push_back(src.narrow(0, offset, s[me]));
      want_splits.push_back(s[me]);
    }
    CHECK_W(at::equal(got, at::cat(parts, 0)), "alltoall ", dtype);
    CHECK_W(h.received_splits() == want_splits, "alltoall splits");
  }
  // Even split by default.
  at::Tensor x = at::arange(2 * n, at::kLong) + 100 * me;
  at::Tensor got = ronde::alltoall(x, ronde::AlltoallOptions().process_set(ps));
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) {
    parts.push_back(at::arange(2 * me, 2 * me + 2, at::kLong) + 100 * r);
  }
  CHECK_W(at::equal(got, at::cat(parts, 0)), "alltoall even");
}

void check_reducescatter(const ronde::ProcessSet& ps = {}) {
  const int n = ps.size(), me = ps.rank();
  for (int64_t rows :
       {int64_t(2 * n), int64_t(2 * n + 1), int64_t(1), int64_t(400 * n + 1)}) {
    at::Tensor x = input_for(me, 300 + rows, {rows, 3}, at::kFloat);
    at::Tensor got =
        ronde::reducescatter(x, ronde::ReducescatterOptions().process_set(ps));
    at::Tensor full = reference_reduce(
        n, 300 + rows, {rows, 3}, at::kFloat, ronde::ReduceOp::Average);
    int64_t base = rows / n, extra = rows % n;
    int64_t start = me * base + std::min<int64_t>(me, extra);
    int64_t count = base + (me < extra ? 1 : 0);
    CHECK_W(close(got, full.narrow(0, start, count)), "reducescatter ", rows);
  }
}

void check_async(const ronde::ProcessSet& ps = {}) {
  const int n = ps.size(), me = ps.rank();
  std::vector<ronde::Handle> handles;
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < 8; ++i) {
    inputs.push_back(input_for(me, 500 + i, {1000 + i}, at::kFloat));
    handles.push_back(ronde::allreduce_async(
        inputs.back(),
        ronde::AllreduceOptions().process_set(ps).op(ronde::ReduceOp::Sum)));
  }
  for (int i = 7; i >= 0; --i) {
    CHECK_W(handles[i].wait(std::chrono::seconds(60)), "async wait timed out");
    CHECK_W(handles[i].done(), "handle not done after wait");
    CHECK_W(
        close(
            handles[i].result(),
            reference_reduce(
                n, 500 + i, {1000 + i}, at::kFloat, ronde::ReduceOp::Sum)),
        "async allreduce ",
        i);
  }
  ronde::barrier_async(ps).wait();
  ronde::barrier(ps);
}

int scenario_collectives() {
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
  std::cout << "TOPOLOGY: " << ronde::local_rank() << " "
            << ronde::local_size() << " " << ronde::cross_rank() << " "
            << ronde::cross_size() << std::endl;
  check_allreduce();
  check_allgather();
  check_broadcast();
  check_alltoall();
  check_reducescatter();
  check_async();
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Process sets: the job in two halves (sets of one rank at 2 and 3 ranks),
// each running every collective at once, against references computed with
// the set's own numbering; an overlapping set after them; the errors.
int scenario_process_sets() {
  // Ranks 0..n/2-1, given to init() before it knows n: from the env.
  const int n_env = std::atoi(std::getenv("RONDE_SIZE"));
  std::vector<int> low, high;
  for (int r = 0; r < n_env; ++r)
    (r < n_env / 2 ? low : high).push_back(r);
  ronde::ProcessSet first(low);
  CHECK_W(first.id() == -1, "a set before init() has an id");
  ronde::init(ronde::InitOptions().process_sets({first}));
  const int n = ronde::size(), me = ronde::rank();
  CHECK_W(first.id() == 1, "init() gave the first set id ", first.id());
  ronde::ProcessSet second = ronde::add_process_set(high);
  CHECK_W(second.id() == 2, "second set id ", second.id());
  CHECK_W(ronde::process_sets().size() == 3, "three sets");
  CHECK_W(ronde::process_sets()[0].is_global(), "global set first");
  const bool in_first = me < n / 2;
  ronde::ProcessSet& mine = in_first ? first : second;
  ronde::ProcessSet& other = in_first ? second : first;
  CHECK_W(mine.included() && !other.included(), "included()");
  CHECK_W(
      mine.rank() == (in_first ? me : me - n / 2) &&
          mine.size() == static_cast<int>((in_first ? low : high).size()),
      "set rank ",
      mine.rank(),
      " size ",
      mine.size());
  CHECK_W(mine.ranks() == (in_first ? low : high), "ranks()");
  // Both halves at once, each in its own order.
  check_allreduce(mine);
  check_allgather(mine);
  check_broadcast(mine);
  check_alltoall(mine);
  check_reducescatter(mine);
  check_async(mine);
  // The job's own collectives meanwhile still span every rank.
  at::Tensor total = ronde::allreduce(
      at::full({1}, static_cast<double>(me), at::kDouble),
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(total.item<double>() == n * (n - 1) / 2.0, "global sum");

  // An async collective on one set, a global one, then the wait: sets run
  // on workers of their own.
  at::Tensor big = at::full({1 << 16}, 1.0f);
  ronde::Handle h = ronde::allreduce_async(
      big,
      ronde::AllreduceOptions().op(ronde::ReduceOp::Sum).process_set(mine));
  ronde::barrier();
  CHECK_W(
      at::equal(h.result(), at::full({1 << 16}, float(mine.size()))),
      "async on a set across a global barrier");

  // A rank outside a set calling on it: an error here, nowhere else.
  expect_error(
      [&] {
        ronde::allreduce(
            at::ones({2}), ronde::AllreduceOptions().process_set(other));
      },
      {"allreduce on process set " + std::to_string(other.id()),
       "called on rank " + std::to_string(me),
       "not in the set"});

  // A mismatch within a set fails on its members, naming the set.
  if (mine.size() > 1) {
    expect_error(
        [&] {
          const int64_t cols = mine.rank() == mine.size() - 1 ? 3 : 2;
          ronde::allreduce(
              at::ones({cols}),
              ronde::AllreduceOptions().name("odd").process_set(mine));
        },
        {"disagree", "'odd'", "process set " + std::to_string(mine.id())});
  }

  // Overlapping sets, one after the other: every rank but 0, then all.
  std::vector<int> tail;
  for (int r = 1; r < n; ++r)
    tail.push_back(r);
  ronde::ProcessSet rest = ronde::add_process_set(tail);
  if (rest.included()) {
    check_allreduce(rest);
    check_broadcast(rest);
  }
  std::vector<int> backwards;
  for (int r = n - 1; r >= 0; --r)
    backwards.push_back(r);
  ronde::ProcessSet all = ronde::add_process_set(ronde::ProcessSet(backwards));
  check_allgather(all);
  CHECK_W(all.ranks()[0] == 0 && all.size() == n, "ranks sorted");
  ronde::remove_process_set(rest);
  expect_error([&] { ronde::barrier(rest); }, {"was removed"});
  CHECK_W(ronde::process_sets().size() == 4, "after one removal");

  // Creations that differ between ranks fail on every rank, naming each
  // rank's request; the job goes on.
  expect_error(
      [&] {
        ronde::add_process_set(
            me == 0 ? std::vector<int>{0} : std::vector<int>{0, 1});
      },
      {"add_process_set",
       "did not all make the same call",
       "rank 0 [0]",
       "rank 1 [0, 1]"});
  expect_error(
      [&] {
        ronde::add_process_set({0, n});
      },
      {"rank " + std::to_string(n) + " is outside [0, " + std::to_string(n) +
       ")"});
  expect_error([&] { ronde::add_process_set(first); }, {"created already"});
  expect_error(
      [&] { ronde::remove_process_set(ronde::global_process_set()); },
      {"cannot be removed"});
  // Ids are never reused.
  ronde::ProcessSet again = ronde::add_process_set(low);
  CHECK_W(again.id() == 5, "ids count up: ", again.id());
  if (again.included())
    check_reducescatter(again);
  ronde::shutdown();
  // A set of a finished job is not part of the next one.
  CHECK_W(first.id() == -1, "a set outlived shutdown()");
  return ronde::testing::scenario_exit_code();
}

// Sums of random floating tensors (below, across and far beyond a chunk)
// and a digest of their bits: the test compares digests across ranks, and
// across jobs that reduce by different algorithms.
int scenario_digest() {
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
          "digest sum ", dtype, " ", count);
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

int scenario_mismatch() {
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
              at::ones({n}), ronde::AlltoallOptions().splits(splits).name(name));
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

// This process dies of SIGKILL 30 ms from now, in whatever it is doing.
void kill_self_soon() {
  std::thread killer([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ::kill(::getpid(), SIGKILL);
  });
  killer.detach();
}

// The last rank dies (SIGKILL) while a large all-reduce is in flight; the
// others must fail with a CommError naming the operation, within the timeout.
int scenario_kill_peer() {
  ronde::init();
  const int me = ronde::rank(), n = ronde::size();
  ronde::barrier();
  at::Tensor big = at::ones({32 << 20});  // 128 MiB: long enough to be mid-way
  if (me == n - 1)
    kill_self_soon();
  try {
    for (int i = 0; i < 50; ++i) {
      ronde::allreduce_(big, ronde::AllreduceOptions().name("big"));
    }
    std::cout << "NO_ERROR" << std::endl;
    return 1;
  } catch (const ronde::CommError& e) {
    ronde::testing::print_comm_error(e);
    // Later calls fail at once, without hanging.
    try {
      ronde::allreduce(at::ones({1}));
      std::cout << "LATER_CALL_SUCCEEDED" << std::endl;
      return 1;
    } catch (const ronde::CommError& later) {
      std::cout << "LATER: " << later.what() << std::endl;
    }
    ronde::shutdown();
    return 3;
  }
}

// A member of a process set dies mid-collective: the other member fails
// with a CommError naming the set, its suspects taken among the set's
// ranks; the rank outside the set learns of it at its next job collective.
int scenario_kill_in_set() {
  ronde::init();
  const int me = ronde::rank(), n = ronde::size();
  std::vector<int> members;
  for (int r = 1; r < n; ++r)
    members.push_back(r);
  ronde::ProcessSet set = ronde::add_process_set(members);
  ronde::barrier();
  if (me == n - 1)
    kill_self_soon();
  try {
    if (set.included()) {
      at::Tensor big = at::ones({32 << 20});
      for (int i = 0; i < 50; ++i) {
        ronde::allreduce_(
            big, ronde::AllreduceOptions().name("in_set").process_set(set));
      }
    } else {
      for (int i = 0; i < 50; ++i)
        ronde::barrier();
    }
    std::cout << "NO_ERROR" << std::endl;
    return 1;
  } catch (const ronde::CommError& e) {
    ronde::testing::print_comm_error(e);
    // Rank 0 hosts the store: it stays while the members look for each
    // other's failure notices there.
    if (!set.included())
      std::this_thread::sleep_for(std::chrono::seconds(4));
    ronde::shutdown();
    return 3;
  }
}

// Holds a job open until the test has tried to disturb it, then proves the
// job still works. argv[2] is a directory shared with the test.
int scenario_hold(const std::string& dir) {
  ronde::init();
  ronde::barrier();
  if (ronde::rank() == 0) {
    std::FILE* f = std::fopen((dir + "/ready").c_str(), "w");
    if (f)
      std::fclose(f);
  }
  struct stat st {};
  for (int i = 0; i < 600 && ::stat((dir + "/go").c_str(), &st) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  at::Tensor got = ronde::allreduce(
      at::ones({5}), ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(
      at::allclose(got, at::full({5}, double(ronde::size()))),
      "allreduce after the intruder");
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Under ronderun: where the job secret is (a private file) and what it is
// (copied to <dir>/secret-<rank> for the test to look for), then a
// collective of the authenticated job, then every process's command line
// and environment as ps shows them.
int scenario_secret_probe(const std::string& dir) {
  const char* path = std::getenv("RONDE_JOB_SECRET_FILE");
  const char* rank_env = std::getenv("RONDE_RANK");
  CHECK_W(
      path != nullptr && rank_env != nullptr, "ronderun gave a secret file");
  if (path == nullptr || rank_env == nullptr)
    return 1;
  struct stat st {};
  CHECK_W(::stat(path, &st) == 0, "the secret file exists");
  std::cout << "SECRET_FILE mode " << std::oct << (st.st_mode & 0777)
            << std::dec << " at " << path << std::endl;
  {
    std::ifstream in(path, std::ios::binary);
    std::ofstream out(dir + "/secret-" + rank_env, std::ios::binary);
    out << in.rdbuf();
  }
  ronde::init();
  at::Tensor got = ronde::allreduce(
      at::ones({3}), ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(
      at::allclose(got, at::full({3}, double(ronde::size()))),
      "allreduce in an authenticated job");
  if (FILE* ps = ::popen("ps axeww -o args 2>&1", "r")) {
    char line[8192];
    while (std::fgets(line, sizeof line, ps) != nullptr)
      std::cout << "PS: " << line;
    ::pclose(ps);
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

// Not a rank: a process that knows the address of a job's store, not its
// secret, writes the values a rank would act on (security_test.cpp).
int scenario_forge_store(int port, const std::string& job) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(10);
  c10d::TCPStore store("127.0.0.1", so);
  auto put = [&](const std::string& key, const std::string& v) {
    store.set(
        "ronde/" + job + "/" + key, std::vector<uint8_t>(v.begin(), v.end()));
  };
  put("stall_shutdown", "forged: everyone close your connections");
  put("progress/1", "999999|forged");
  put("failed/1", "\x01");
  return 0;
}

// Expects init() to be refused.
int scenario_intruder() {
  try {
    ronde::init();
    std::cout << "INTRUDER_ADMITTED" << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cout << "REFUSED: " << e.what() << std::endl;
    return 4;
  }
}

// Expects init() to fail cleanly (not crash); prints the message.
int scenario_init_error() {
  try {
    ronde::init();
    ronde::allreduce(at::ones({4}));
    std::cout << "INIT_SUCCEEDED" << std::endl;
    ronde::shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cout << "INIT_ERROR: " << e.what() << std::endl;
    return 5;
  }
}

// Rank 1 aborts at once, as an uncaught exception would; the others sleep
// for a minute and exit 0 unless the harness stops them first
// (JobSpec::crash_grace).
int scenario_crash() {
  const char* rank_env = std::getenv("RONDE_RANK");
  if (rank_env != nullptr && std::atoi(rank_env) == 1)
    std::abort();
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

}  // namespace

int run_optim_scenario(int argc, char** argv);       // worker_optim.cpp
int run_checkpoint_scenario(int argc, char** argv);  // worker_checkpoint.cpp
int run_sync_bn_scenario(int argc, char** argv);     // worker_sync_bn.cpp
int run_observe_scenario(int argc, char** argv);     // worker_observe.cpp

int main(int argc, char** argv) {
  at::set_num_threads(1);
  ronde::testing::install_crash_report();
  std::string name = argc > 1 ? argv[1] : "";
  try {
    if (name == "collectives")
      return scenario_collectives();
    if (name == "mismatch")
      return scenario_mismatch();
    if (name == "process_sets")
      return scenario_process_sets();
    if (name == "digest")
      return scenario_digest();
    if (name == "kill_peer")
      return scenario_kill_peer();
    if (name == "kill_in_set")
      return scenario_kill_in_set();
    if (name == "hold")
      return scenario_hold(argc > 2 ? argv[2] : "/tmp");
    if (name == "intruder")
      return scenario_intruder();
    if (name == "forge_store" && argc > 3)
      return scenario_forge_store(std::atoi(argv[2]), argv[3]);
    if (name == "secret_probe")
      return scenario_secret_probe(argc > 2 ? argv[2] : "/tmp");
    if (name == "init_error")
      return scenario_init_error();
    if (name == "crash")
      return scenario_crash();
    if (int rc = run_optim_scenario(argc, argv); rc >= 0)
      return rc;
    if (int rc = run_checkpoint_scenario(argc, argv); rc >= 0)
      return rc;
    if (int rc = run_sync_bn_scenario(argc, argv); rc >= 0)
      return rc;
    if (int rc = run_observe_scenario(argc, argv); rc >= 0)
      return rc;
  } catch (const std::exception& e) {
    std::cout << "UNCAUGHT: " << e.what() << std::endl;
    return 2;
  }
  std::cerr << "unknown scenario '" << name << "'" << std::endl;
  return 2;
}
