// ronde.torch._C's process sets: the ProcessSet class (equality, hash and
// repr for use as a dict key) and the functions that add, remove and list
// them. Registered before anything that takes a set as an argument.
#include "bindings.h"

#include <ronde/process_set.h>

#include <pybind11/operators.h>

#include <functional>
#include <string>
#include <vector>

namespace ronde::detail {

void bind_process_sets(py::module_& m) {
  py::class_<ProcessSet>(m, "ProcessSet")
      .def(py::init<>())
      .def(py::init<std::vector<int>>(), py::arg("ranks"))
      .def_property_readonly("id", &ProcessSet::id)
      .def_property_readonly("process_set_id", &ProcessSet::id)
      .def_property_readonly("ranks", &ProcessSet::ranks)
      .def("included", &ProcessSet::included)
      .def("rank", &ProcessSet::rank)
      // Horovod's size() answers on ranks outside the set too.
      .def(
          "size",
          [](const ProcessSet& s) {
            return s.is_global() ? s.size()
                                 : static_cast<int>(s.ranks().size());
          })
      .def("is_global", &ProcessSet::is_global)
      .def(py::self == py::self)
      .def(py::self != py::self)
      .def(
          "__hash__",
          [](const ProcessSet& s) {
            return s.is_global() ? 0
                                 : std::hash<const void*>()(s.group().get());
          })
      .def("__repr__", [](const ProcessSet& s) {
        if (s.is_global())
          return std::string("ProcessSet(global)");
        std::string r = "ProcessSet(id=" + std::to_string(s.id()) + ", ranks=[";
        const std::vector<int> ranks = s.ranks();
        for (size_t i = 0; i < ranks.size(); ++i)
          r += (i ? ", " : "") + std::to_string(ranks[i]);
        return r + "])";
      });
  m.def("global_process_set", &global_process_set);
  m.def(
      "add_process_set",
      [](const ProcessSet& s) { return add_process_set(s); },
      py::arg("process_set"),
      release_gil());
  m.def(
      "add_process_set",
      [](const std::vector<int>& ranks) { return add_process_set(ranks); },
      py::arg("ranks"),
      release_gil());
  m.def("remove_process_set", &remove_process_set, release_gil());
  m.def("process_sets", &process_sets);
}

}  // namespace ronde::detail
