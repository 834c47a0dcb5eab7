// The reference inputs and results of the collective scenarios, and the
// checks of every collective against them (worker_reference.h).
#include "worker_reference.h"

#include <ronde/errors.h>

#include "worker_checks.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace ronde::testing {

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
                   : dtype == at::kHalf   ? 1.0 / 2048
                                          : 1e-6;
  at::Tensor err = (got.to(at::kDouble) - want).abs();
  return got.sizes().equals(shape) && got.scalar_type() == dtype &&
         at::all(err <= 1e-5 + n * u * magnitude).item<bool>();
}

const std::vector<at::ScalarType> kFloatTypes = {
    at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
const std::vector<at::ScalarType> kIntTypes = {
    at::kChar, at::kByte, at::kShort, at::kInt, at::kLong};

void check_allreduce(const ronde::ProcessSet& ps) {
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

void check_allgather(const ronde::ProcessSet& ps) {
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

void check_broadcast(const ronde::ProcessSet& ps) {
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

void check_alltoall(const ronde::ProcessSet& ps) {
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

void check_reducescatter(const ronde::ProcessSet& ps) {
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

// The _into forms write the same results into the caller's tensor: rows
// that differ per rank, parts too large to ride with the check, uneven
// splits.
void check_into(const ronde::ProcessSet& ps) {
  const int n = ps.size(), me = ps.rank();
  for (int64_t big : {int64_t{0}, int64_t{400}}) {
    auto rows_of = [&](int r) { return r == 1 ? int64_t{0} : r + 2 + big; };
    at::Tensor x = input_for(me, 600 + big, {rows_of(me), 3}, at::kFloat);
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n; ++r)
      parts.push_back(input_for(r, 600 + big, {rows_of(r), 3}, at::kFloat));
    at::Tensor want = at::cat(parts, 0);
    at::Tensor out = at::full_like(want, -1);
    ronde::allgather_into(x, out, ronde::CollectiveOptions().process_set(ps));
    CHECK_W(at::equal(out, want), "allgather_into, ", big);
  }
  // Rank r sends (r + d) % 3 rows (plus `big`) to rank d.
  for (int64_t big : {int64_t{0}, int64_t{300}}) {
    auto split = [&](int r, int d) { return (r + d) % 3 + big; };
    std::vector<int64_t> splits;
    int64_t rows = 0, got_rows = 0;
    for (int d = 0; d < n; ++d) {
      splits.push_back(split(me, d));
      rows += split(me, d);
      got_rows += split(d, me);
    }
    at::Tensor x = input_for(me, 700 + big, {rows, 2}, at::kLong);
    at::Tensor out = at::full({got_rows, 2}, -1, at::kLong);
    const std::vector<int64_t> recv = ronde::alltoall_into(
        x, out, ronde::AlltoallOptions().process_set(ps).splits(splits));
    std::vector<at::Tensor> parts;
    std::vector<int64_t> want_recv;
    for (int r = 0; r < n; ++r) {
      int64_t src_rows = 0, offset = 0;
      for (int d = 0; d < n; ++d) {
        src_rows += split(r, d);
        if (d < me)
          offset += split(r, d);
      }
      parts.push_back(input_for(r, 700 + big, {src_rows, 2}, at::kLong)
                          .narrow(0, offset, split(r, me)));
      want_recv.push_back(split(r, me));
    }
    CHECK_W(at::equal(out, at::cat(parts, 0)), "alltoall_into, ", big);
    CHECK_W(recv == want_recv, "alltoall_into splits, ", big);
  }
  for (int64_t rows : {int64_t(2 * n + 1), int64_t(400 * n + 1)}) {
    at::Tensor x = input_for(me, 800 + rows, {rows, 3}, at::kFloat);
    const int64_t base = rows / n, extra = rows % n;
    const int64_t start = me * base + std::min<int64_t>(me, extra);
    const int64_t count = base + (me < extra ? 1 : 0);
    at::Tensor out = at::full({count, 3}, -1.0f);
    ronde::Handle h = ronde::reducescatter_into_async(
        x, out, ronde::ReducescatterOptions().process_set(ps));
    // Written where it lies, not copied there.
    CHECK_W(h.result().data_ptr() == out.data_ptr(), "result is not out");
    at::Tensor full = reference_reduce(
        n, 800 + rows, {rows, 3}, at::kFloat, ronde::ReduceOp::Average);
    CHECK_W(
        close(out, full.narrow(0, start, count)), "reducescatter_into ", rows);
  }
}

void check_async(const ronde::ProcessSet& ps) {
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

}  // namespace ronde::testing
