// ronde.torch._C's collectives on torch.Tensor: ReduceOp, the Handle of a
// collective in flight, each collective in its blocking, _async and
// in-place forms, barrier, join and broadcast_parameters.
#include "bindings.h"

#include <ronde/collectives.h>
#include <ronde/optimizer.h>
#include <ronde/process_set.h>

#include <torch/extension.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {
namespace {

AllreduceOptions allreduce_options(
    ReduceOp op,
    double prescale,
    double postscale,
    const std::string& name,
    const ProcessSet& ps) {
  return AllreduceOptions()
      .op(op)
      .prescale_factor(prescale)
      .postscale_factor(postscale)
      .name(name)
      .process_set(ps);
}

ReducescatterOptions reducescatter_options(
    ReduceOp op,
    double prescale,
    double postscale,
    const std::string& name,
    const ProcessSet& ps) {
  return ReducescatterOptions()
      .op(op)
      .prescale_factor(prescale)
      .postscale_factor(postscale)
      .name(name)
      .process_set(ps);
}

AlltoallOptions alltoall_options(
    const std::optional<std::vector<int64_t>>& splits,
    const std::string& name,
    const ProcessSet& ps) {
  return AlltoallOptions()
      .splits(splits.value_or(std::vector<int64_t>{}))
      .name(name)
      .process_set(ps);
}

CollectiveOptions named(const std::string& name, const ProcessSet& ps) {
  return CollectiveOptions().name(name).process_set(ps);
}

}  // namespace

void bind_collectives(py::module_& m) {
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("Sum", ReduceOp::Sum)
      .value("Average", ReduceOp::Average)
      .value("Min", ReduceOp::Min)
      .value("Max", ReduceOp::Max)
      .value("Product", ReduceOp::Product);

  // Handles.
  py::class_<Handle>(m, "Handle")
      .def("done", &Handle::done, release_gil())
      .def(
          "wait",
          [](const Handle& h, std::optional<double> timeout) {
            if (!timeout) {
              h.wait();
              return true;
            }
            return h.wait(std::chrono::milliseconds(
                static_cast<int64_t>(*timeout * 1000)));
          },
          py::arg("timeout") = py::none(),
          release_gil())
      .def("result", &Handle::result, release_gil())
      .def("received_splits", &Handle::received_splits, release_gil());

  // Collectives. Each has the blocking form, the _async form (a Handle),
  // and the in-place forms where C++ has them.
  const auto op_arg = py::arg("op") = ReduceOp::Average;
  m.def(
      "allreduce",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps) {
        return allreduce(t, allreduce_options(op, pre, post, name, ps));
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "allreduce_",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps) {
        allreduce_(t, allreduce_options(op, pre, post, name, ps));
        return t;
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "allreduce_async",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps) {
        return allreduce_async(t, allreduce_options(op, pre, post, name, ps));
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "allreduce_async_",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps) {
        return allreduce_async_(t, allreduce_options(op, pre, post, name, ps));
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "allgather",
      [](const at::Tensor& t,
         const std::string& name,
         const ProcessSet& ps,
         const std::optional<at::Tensor>& out) {
        if (!out)
          return allgather(t, named(name, ps));
        allgather_into(t, *out, named(name, ps));
        return *out;
      },
      py::arg("tensor"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      py::arg("out") = py::none(),
      release_gil());
  m.def(
      "allgather_async",
      [](const at::Tensor& t,
         const std::string& name,
         const ProcessSet& ps,
         const std::optional<at::Tensor>& out) {
        return out ? allgather_into_async(t, *out, named(name, ps))
                   : allgather_async(t, named(name, ps));
      },
      py::arg("tensor"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      py::arg("out") = py::none(),
      release_gil());
  m.def(
      "broadcast",
      [](const at::Tensor& t,
         int root,
         const std::string& name,
         const ProcessSet& ps) { return broadcast(t, root, named(name, ps)); },
      py::arg("tensor"),
      py::arg("root_rank"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "broadcast_",
      [](const at::Tensor& t,
         int root,
         const std::string& name,
         const ProcessSet& ps) {
        broadcast_(t, root, named(name, ps));
        return t;
      },
      py::arg("tensor"),
      py::arg("root_rank"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "broadcast_async",
      [](const at::Tensor& t,
         int root,
         const std::string& name,
         const ProcessSet& ps) {
        return broadcast_async(t, root, named(name, ps));
      },
      py::arg("tensor"),
      py::arg("root_rank"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "broadcast_async_",
      [](const at::Tensor& t,
         int root,
         const std::string& name,
         const ProcessSet& ps) {
        return broadcast_async_(t, root, named(name, ps));
      },
      py::arg("tensor"),
      py::arg("root_rank"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "alltoall",
      [](const at::Tensor& t,
         const std::optional<std::vector<int64_t>>& splits,
         const std::string& name,
         const ProcessSet& ps,
         const std::optional<at::Tensor>& out) {
        if (!out)
          return alltoall(t, alltoall_options(splits, name, ps));
        alltoall_into(t, *out, alltoall_options(splits, name, ps));
        return *out;
      },
      py::arg("tensor"),
      py::arg("splits") = py::none(),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      py::arg("out") = py::none(),
      release_gil());
  m.def(
      "alltoall_async",
      [](const at::Tensor& t,
         const std::optional<std::vector<int64_t>>& splits,
         const std::string& name,
         const ProcessSet& ps,
         const std::optional<at::Tensor>& out) {
        return out ? alltoall_into_async(
                         t, *out, alltoall_options(splits, name, ps))
                   : alltoall_async(t, alltoall_options(splits, name, ps));
      },
      py::arg("tensor"),
      py::arg("splits") = py::none(),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      py::arg("out") = py::none(),
      release_gil());
  m.def(
      "reducescatter",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps,
         const std::optional<at::Tensor>& out) {
        const ReducescatterOptions o =
            reducescatter_options(op, pre, post, name, ps);
        if (!out)
          return reducescatter(t, o);
        reducescatter_into(t, *out, o);
        return *out;
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      py::arg("out") = py::none(),
      release_gil());
  m.def(
      "reducescatter_async",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps,
         const std::optional<at::Tensor>& out) {
        const ReducescatterOptions o =
            reducescatter_options(op, pre, post, name, ps);
        return out ? reducescatter_into_async(t, *out, o)
                   : reducescatter_async(t, o);
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      py::arg("out") = py::none(),
      release_gil());
  m.def(
      "barrier",
      [](const ProcessSet& ps) { barrier(ps); },
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "barrier_async",
      [](const ProcessSet& ps) { return barrier_async(ps); },
      py::arg("process_set") = ProcessSet(),
      release_gil());

  m.def(
      "join",
      [](const ProcessSet& ps) { return join(ps); },
      py::arg("process_set") = ProcessSet(),
      release_gil());

  m.def(
      "broadcast_parameters",
      [](const std::vector<std::string>& names,
         const std::vector<at::Tensor>& tensors,
         int root,
         const ProcessSet& ps) {
        TORCH_CHECK(
            names.size() == tensors.size(),
            "ronde: broadcast_parameters got ",
            names.size(),
            " names for ",
            tensors.size(),
            " tensors");
        torch::OrderedDict<std::string, torch::Tensor> dict;
        for (size_t i = 0; i < names.size(); ++i)
          dict.insert(names[i], tensors[i]);
        broadcast_parameters(dict, root, ps);
      },
      py::arg("names"),
      py::arg("tensors"),
      py::arg("root_rank"),
      py::arg("process_set") = ProcessSet(),
      release_gil());
}

}  // namespace ronde::detail
