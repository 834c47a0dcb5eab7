// What the operations of ronde's c10d backend share (c10d/backend.cpp,
// c10d/scatter.cpp): c10d's reductions as ronde's, the reshaping of torch's
// tensors into what ronde's cross-rank check compares, and launch(), which
// ties an operation's ronde collectives to the c10d::Work it returns.
// Names torch's c10d as `::c10d::`; include it before <ronde/c10d.h>.
#pragma once

#include "c10d/work.h"

#include <ronde/collectives.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ronde::detail::c10d_ops {

// ronde's reduction for c10d's, and the factor PREMUL_SUM multiplies by.
inline ReduceOp reduction(
    const ::c10d::ReduceOp& op, const char* what, double* pre) {
  *pre = 1.0;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM:
      return ReduceOp::Sum;
    case ::c10d::ReduceOp::AVG:
      return ReduceOp::Average;
    case ::c10d::ReduceOp::PRODUCT:
      return ReduceOp::Product;
    case ::c10d::ReduceOp::MIN:
      return ReduceOp::Min;
    case ::c10d::ReduceOp::MAX:
      return ReduceOp::Max;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      auto* s =
          dynamic_cast<::c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(
          s != nullptr, "ronde: ", what, ": PREMUL_SUM without its factor");
      *pre = s->tensor_factor.defined() ? s->tensor_factor.item<double>()
                                        : s->double_factor;
      return ReduceOp::Sum;
    }
    default:
      break;
  }
  TORCH_CHECK(
      false,
      "ronde: ",
      what,
      ": ReduceOp ",
      static_cast<int>(op.op_),
      " (BAND, BOR or BXOR) is not supported; ronde reduces with SUM, AVG, "
      "PREMUL_SUM, PRODUCT, MIN and MAX");
}

inline at::Tensor one(
    const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(
      tensors.size() == 1,
      "ronde: ",
      what,
      " takes one tensor per call, got ",
      tensors.size());
  return tensors[0];
}

inline at::Tensor row(const at::Tensor& t) {
  return t.reshape({1, -1});
}

// Copies `from` (any shape, as many elements) into `to`, unless it is
// already there.
inline void copy_into(const at::Tensor& to, const at::Tensor& from) {
  if (to.is_contiguous() && from.data_ptr() == to.data_ptr())
    return;
  to.copy_(from.reshape(to.sizes()));
}

// Copies the consecutive pieces of the flat `from` into `outputs`, which
// hold exactly its elements.
inline void scatter_into(
    const std::vector<at::Tensor>& outputs, const at::Tensor& from) {
  const at::Tensor flat = from.reshape({-1});
  int64_t offset = 0;
  for (const at::Tensor& out : outputs) {
    TORCH_CHECK(
        offset + out.numel() <= flat.numel(),
        "ronde: the outputs hold more elements than the collective gave");
    copy_into(out, flat.narrow(0, offset, out.numel()));
    offset += out.numel();
  }
  TORCH_CHECK(
      offset == flat.numel(),
      "ronde: the outputs hold ",
      offset,
      " elements, the collective gave ",
      flat.numel());
}

// Every output of a gather holds one rank's input: as many elements, of
// its type. Checked before the collective, so that a misshapen output is
// an error, not a copy of the wrong elements.
inline void check_outputs_match(
    const std::vector<at::Tensor>& outputs,
    const at::Tensor& input,
    const char* what) {
  for (size_t r = 0; r < outputs.size(); ++r) {
    TORCH_CHECK(
        outputs[r].numel() == input.numel() &&
            outputs[r].scalar_type() == input.scalar_type(),
        "ronde: ",
        what,
        ": output ",
        r,
        " is ",
        outputs[r].scalar_type(),
        outputs[r].sizes(),
        ", the input ",
        input.scalar_type(),
        input.sizes(),
        " (each output holds one rank's input)");
  }
}

inline at::Tensor flat_cat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const at::Tensor& t : tensors)
    flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

inline void check_same_count(
    const std::vector<at::Tensor>& tensors, int n, const char* what) {
  TORCH_CHECK(
      static_cast<int>(tensors.size()) == n,
      "ronde: ",
      what,
      " needs one tensor per rank of the group (",
      n,
      "), got ",
      tensors.size());
}

// The input of a reduce-scatter into `output`, as rows of one rank's part:
// [size, output.numel()] when the input holds size x that; as it is (ronde's
// check then fails the call on every rank) when not.
inline at::Tensor scatter_rows(
    const at::Tensor& input, const at::Tensor& output, int size) {
  if (input.numel() == output.numel() * size)
    return input.reshape({size, -1});
  return input.reshape({-1});
}

// Where a reduce-scatter of `input` writes this rank's part: straight into
// `output` when it holds exactly that part and is contiguous (no copy out,
// no fresh tensor; ronde writes it only when `output` does not overlap
// `input`), else nowhere given (a new tensor, copied into `output`, or the
// mismatch reported before anything is written).
inline at::Tensor scatter_into_output(
    const at::Tensor& input, const at::Tensor& output, int size) {
  if (output.is_contiguous() && input.numel() == output.numel() * size)
    return output;
  return at::Tensor();
}

// Runs one operation, counted in `seq`: `start` submits its collectives;
// `finish` copies their results into torch's outputs once they are done.
template <class Start>
c10::intrusive_ptr<::c10d::Work> launch(
    std::atomic<uint64_t>& seq,
    int rank,
    const std::string& group,
    ::c10d::OpType type,
    const char* op,
    std::vector<at::Tensor> outputs,
    Start start,
    std::function<void()> finish = {}) {
  seq.fetch_add(1);
  std::string what = std::string(op) + " on rank " + std::to_string(rank);
  if (group != "0")
    what += " of process group '" + group + "'";
  auto work =
      c10::make_intrusive<C10dWork>(rank, type, what, std::move(outputs));
  std::vector<Handle> handles;
  try {
    handles = start();
  } catch (...) {
    work->complete(std::current_exception());
    return work;
  }
  ronde::detail::complete_when_done(
      work, std::move(handles), std::move(finish));
  return work;
}

}  // namespace ronde::detail::c10d_ops

// In a member function of ronde::c10d::Backend: launch() for this group.
#define RONDE_LAUNCH(type, op, outputs, ...) \
  launch(seq_, rank_, name_, ::c10d::OpType::type, op, outputs, __VA_ARGS__)
