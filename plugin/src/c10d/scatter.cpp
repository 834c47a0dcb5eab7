// The gathering and scattering operations of ronde's c10d backend
// (c10d/backend.cpp has the rest): gather and scatter, the reduce-scatters
// and the all-to-alls. ronde has no rooted gather or scatter: gather is an
// allgather that the root keeps, scatter an all-to-all in which only the
// root sends.
// The private headers first, as in c10d/backend.cpp.
#include "c10d/ops.h"
#include "comm/collective_calls.h"

#include <ronde/c10d.h>

#include <memory>
#include <vector>

namespace ronde::c10d {

using namespace ronde::detail::c10d_ops;

c10::intrusive_ptr<::c10d::Work> Backend::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::GatherOptions& opts) {
  // An allgather, kept by the root only.
  auto handle = std::make_shared<Handle>();
  const bool root = opts.rootRank == rank_;
  std::vector<at::Tensor> outs =
      root && !outputs.empty() ? outputs[0] : std::vector<at::Tensor>{};
  return RONDE_LAUNCH(
      GATHER,
      "gather",
      outs,
      [&] {
        TORCH_CHECK(
            opts.rootRank >= 0 && opts.rootRank < size_,
            "ronde: gather: root rank ",
            opts.rootRank,
            " is outside [0, ",
            size_,
            ")");
        const at::Tensor input = one(inputs, "gather");
        if (root) {
          check_same_count(outs, size_, "gather (on the root)");
          check_outputs_match(outs, input, "gather");
        }
        *handle = ronde::detail::allgather_call(
            row(input), CollectiveOptions().process_set(set_), !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outs, handle, root] {
        if (root)
          scatter_into(outs, handle->result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ScatterOptions& opts) {
  // An alltoall in which only the root sends.
  auto handle = std::make_shared<Handle>();
  const int root = static_cast<int>(opts.rootRank);
  return RONDE_LAUNCH(
      SCATTER,
      "scatter",
      outputs,
      [&] {
        const at::Tensor out = one(outputs, "scatter");
        TORCH_CHECK(
            root >= 0 && root < size_,
            "ronde: scatter: root rank ",
            root,
            " is outside [0, ",
            size_,
            ")");
        std::vector<int64_t> splits(size_, 0);
        at::Tensor send;
        if (root == rank_) {
          TORCH_CHECK(
              inputs.size() == 1, "ronde: scatter takes one input list");
          check_same_count(inputs[0], size_, "scatter (on the root)");
          for (int r = 0; r < size_; ++r)
            splits[r] = inputs[0][r].numel();
          send = flat_cat(inputs[0]);
        } else {
          send = at::empty({0}, out.options());
        }
        *handle = ronde::detail::alltoall_call(
            send,
            AlltoallOptions().splits(splits).process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outputs, handle, root] {
        const std::vector<int64_t> got = handle->received_splits();
        TORCH_CHECK(
            got[root] == outputs[0].numel(),
            "ronde: scatter: the root sent ",
            got[root],
            " elements to an output of ",
            outputs[0].numel());
        copy_into(outputs[0], handle->result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      REDUCE_SCATTER,
      "reduce_scatter",
      outputs,
      [&] {
        const at::Tensor out = one(outputs, "reduce_scatter");
        TORCH_CHECK(
            inputs.size() == 1, "ronde: reduce_scatter takes one input list");
        check_same_count(inputs[0], size_, "reduce_scatter");
        std::vector<at::Tensor> rows;
        for (const at::Tensor& t : inputs[0])
          rows.push_back(row(t));
        double pre = 1.0;
        const ReduceOp op = reduction(opts.reduceOp, "reduce_scatter", &pre);
        const at::Tensor in = at::cat(rows);
        *handle = ronde::detail::reducescatter_call(
            in,
            ReducescatterOptions().op(op).prescale_factor(pre).process_set(
                set_),
            !opts.asyncOp,
            scatter_into_output(in, out, size_));
        return std::vector<Handle>{*handle};
      },
      [outputs, handle] { copy_into(outputs[0], handle->result()); });
}

c10::intrusive_ptr<::c10d::Work> Backend::_reduce_scatter_base(
    at::Tensor& output,
    at::Tensor& input,
    const ::c10d::ReduceScatterOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      _REDUCE_SCATTER_BASE,
      "reduce_scatter_tensor",
      {output},
      [&] {
        double pre = 1.0;
        const ReduceOp op =
            reduction(opts.reduceOp, "reduce_scatter_tensor", &pre);
        *handle = ronde::detail::reducescatter_call(
            scatter_rows(input, output, size_),
            ReducescatterOptions().op(op).prescale_factor(pre).process_set(
                set_),
            !opts.asyncOp,
            scatter_into_output(input, output, size_));
        return std::vector<Handle>{*handle};
      },
      [output, handle] {
        const at::Tensor r = handle->result();
        TORCH_CHECK(
            r.numel() == output.numel(),
            "ronde: reduce_scatter_tensor: this rank's part has ",
            r.numel(),
            " elements, the output ",
            output.numel());
        copy_into(output, r);
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  auto handles = std::make_shared<std::vector<Handle>>();
  return RONDE_LAUNCH(
      COALESCED,
      "reduce_scatter_tensor_coalesced",
      outputs,
      [&] {
        TORCH_CHECK(
            outputs.size() == inputs.size(),
            "ronde: reduce_scatter_tensor_coalesced: ",
            outputs.size(),
            " outputs for ",
            inputs.size(),
            " inputs");
        double pre = 1.0;
        const ReduceOp op =
            reduction(opts.reduceOp, "reduce_scatter_tensor_coalesced", &pre);
        for (size_t i = 0; i < inputs.size(); ++i) {
          handles->push_back(ronde::detail::reducescatter_call(
              scatter_rows(inputs[i], outputs[i], size_),
              ReducescatterOptions().op(op).prescale_factor(pre).process_set(
                  set_),
              false,
              scatter_into_output(inputs[i], outputs[i], size_)));
        }
        return *handles;
      },
      [outputs, handles] {
        for (size_t i = 0; i < outputs.size(); ++i) {
          const at::Tensor r = (*handles)[i].result();
          TORCH_CHECK(
              r.numel() == outputs[i].numel(),
              "ronde: reduce_scatter_tensor_coalesced: output ",
              i,
              " has ",
              outputs[i].numel(),
              " elements, this rank's part ",
              r.numel());
          copy_into(outputs[i], r);
        }
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::alltoall_base(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits,
    const ::c10d::AllToAllOptions& opts) {
  auto handle = std::make_shared<Handle>();
  std::vector<int64_t> expect = output_splits;
  if (expect.empty() && output.dim() > 0) {
    TORCH_CHECK(
        output.size(0) % size_ == 0,
        "ronde: all_to_all_single: the output's ",
        output.size(0),
        " rows do not split evenly over ",
        size_,
        " ranks");
    expect.assign(size_, output.size(0) / size_);
  }
  return RONDE_LAUNCH(
      ALLTOALL_BASE,
      "all_to_all_single",
      {output},
      [&] {
        at::Tensor in = input.dim() == 0 ? input.reshape({1}) : input;
        // Straight into the output when it is laid out as what comes.
        const bool direct = output.is_contiguous() && output.dim() > 0 &&
                            in.dim() == output.dim() &&
                            in.sizes().slice(1) == output.sizes().slice(1);
        *handle = ronde::detail::alltoall_call(
            in,
            AlltoallOptions().splits(input_splits).process_set(set_),
            !opts.asyncOp,
            direct ? output : at::Tensor(),
            expect);
        return std::vector<Handle>{*handle};
      },
      [output, handle, expect] {
        const std::vector<int64_t> got = handle->received_splits();
        TORCH_CHECK(
            got == expect,
            "ronde: all_to_all_single: the ranks sent ",
            c10::IntArrayRef(got),
            " rows, where this rank expects ",
            c10::IntArrayRef(expect));
        copy_into(output, handle->result());
      });
}

c10::intrusive_ptr<::c10d::Work> Backend::alltoall(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const ::c10d::AllToAllOptions& opts) {
  auto handle = std::make_shared<Handle>();
  return RONDE_LAUNCH(
      ALLTOALL,
      "all_to_all",
      outputs,
      [&] {
        check_same_count(inputs, size_, "all_to_all");
        check_same_count(outputs, size_, "all_to_all");
        std::vector<int64_t> splits;
        for (const at::Tensor& t : inputs)
          splits.push_back(t.numel());
        *handle = ronde::detail::alltoall_call(
            flat_cat(inputs),
            AlltoallOptions().splits(splits).process_set(set_),
            !opts.asyncOp);
        return std::vector<Handle>{*handle};
      },
      [outputs, handle] {
        const std::vector<int64_t> got = handle->received_splits();
        for (size_t r = 0; r < outputs.size(); ++r) {
          TORCH_CHECK(
              got[r] == outputs[r].numel(),
              "ronde: all_to_all: rank ",
              r,
              " sent ",
              got[r],
              " elements to an output of ",
              outputs[r].numel());
        }
        scatter_into(outputs, handle->result());
      });
}

}  // namespace ronde::c10d
