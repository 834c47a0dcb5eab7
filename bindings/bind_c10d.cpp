// ronde.torch._C's c10d backend: the class torch.distributed gets from the
// creator that ronde.torch registers as "ronde" (python/ronde/torch/
// _c10d.py), a subclass of torch's own binding of c10d::Backend (the two
// extensions share pybind11's type registry: torch's headers, one ABI).
#include "bindings.h"

#include <ronde/c10d.h>

#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <chrono>
#include <string>
#include <vector>

namespace ronde::detail {

void bind_c10d(py::module_& m) {
  // The base class is torch's binding, registered by torch._C.
  py::module_::import("torch.distributed");
  py::class_<
      ronde::c10d::Backend,
      ::c10d::Backend,
      c10::intrusive_ptr<ronde::c10d::Backend>>(
      m,
      "C10dBackend",
      "ronde's torch.distributed backend for one process group (made by "
      "init_process_group(\"ronde\") and new_group(), not by hand)")
      .def_property_readonly(
          "process_set",
          [](const ronde::c10d::Backend& b) { return b.process_set(); },
          "The ronde process set the group's collectives run on");
  m.def(
      "_c10d_backend",
      [](const c10::intrusive_ptr<::c10d::Store>& store,
         int rank,
         int size,
         std::chrono::milliseconds timeout,
         std::vector<int> global_ranks,
         std::string group_name) {
        ronde::c10d::BackendOptions o;
        o.store = store;
        o.rank = rank;
        o.size = size;
        o.timeout = timeout;
        o.global_ranks = std::move(global_ranks);
        o.group_name = std::move(group_name);
        return c10::make_intrusive<ronde::c10d::Backend>(o);
      },
      py::arg("store"),
      py::arg("rank"),
      py::arg("size"),
      py::arg("timeout"),
      py::arg("global_ranks"),
      py::arg("group_name"),
      release_gil());
}

}  // namespace ronde::detail
