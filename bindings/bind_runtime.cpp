// ronde.torch._C's runtime: CommError and the translation of C++ errors
// into Python exceptions, init() and shutdown(), and the job's topology
// and build facts.
#include "bindings.h"

#include <ronde/errors.h>
#include <ronde/process_set.h>
#include <ronde/runtime.h>
#include <ronde/version.h>

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <tuple>
#include <vector>

namespace ronde::detail {
namespace {

// ronde.torch.CommError, a RuntimeError carrying CommError's fields.
PyObject* comm_error_type = nullptr;
// ronde.torch.InvalidArgumentError: c10::ValueError (a call every rank
// rejected for its arguments), a ValueError as Horovod raises and a
// RuntimeError as ronde raised before.
PyObject* invalid_argument_type = nullptr;

void raise_comm_error(const CommError& e) {
  py::gil_scoped_acquire gil;
  py::object type = py::reinterpret_borrow<py::object>(comm_error_type);
  py::object err = type(py::str(e.what()));
  err.attr("kind") = py::str(to_string(e.kind()));
  err.attr("operation") = py::str(e.operation());
  err.attr("tensor") = py::str(e.tensor());
  err.attr("rank") = py::int_(e.rank());
  err.attr("suspect_ranks") = py::cast(e.suspect_ranks());
  err.attr("backend") = py::str(e.backend());
  err.attr("backend_message") = py::str(e.backend_message());
  PyErr_SetObject(comm_error_type, err.ptr());
}

// c10::Error's message without the C++ backtrace: the text the C++ caller
// sees from what_without_backtrace(), as a Python exception of the matching
// class (TORCH_CHECK: RuntimeError; TORCH_CHECK_VALUE: ValueError; ...).
void translate_exceptions(std::exception_ptr p) {
  try {
    if (p)
      std::rethrow_exception(p);
  } catch (const CommError& e) {
    raise_comm_error(e);
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(invalid_argument_type, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace

void bind_runtime(py::module_& m) {
  comm_error_type =
      PyErr_NewException("ronde.torch.CommError", PyExc_RuntimeError, nullptr);
  m.attr("CommError") = py::handle(comm_error_type);
  py::tuple bases = py::make_tuple(
      py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError));
  invalid_argument_type = PyErr_NewException(
      "ronde.torch.InvalidArgumentError", bases.ptr(), nullptr);
  m.attr("InvalidArgumentError") = py::handle(invalid_argument_type);
  // Module-local: it serves every binding of this extension, whichever
  // file defines it, and no other extension's.
  py::register_local_exception_translator(translate_exceptions);

  m.def(
      "init",
      [](double timeout_seconds,
         const std::string& hostname,
         const std::string& gloo_algorithm,
         const std::vector<ProcessSet>& process_sets,
         const std::string& job_secret_file) {
        init(InitOptions()
                 .timeout_seconds(timeout_seconds)
                 .hostname(hostname)
                 .gloo_algorithm(gloo_algorithm)
                 .process_sets(process_sets)
                 .job_secret_file(job_secret_file));
      },
      py::arg("timeout_seconds") = 0.0,
      py::arg("hostname") = "",
      py::arg("gloo_algorithm") = "",
      py::arg("process_sets") = std::vector<ProcessSet>{},
      py::arg("job_secret_file") = "",
      release_gil());
  m.def("shutdown", &shutdown, release_gil());
  m.def("is_initialized", &is_initialized);
  m.def("rank", &rank);
  m.def("size", &size);
  m.def("local_rank", &local_rank);
  m.def("local_size", &local_size);
  m.def("cross_rank", &cross_rank);
  m.def("cross_size", &cross_size);
  m.def("job_id", &job_id);
  m.def("nccl_built", &nccl_built);
  m.def("host_backend", &host_backend);
  m.def("timeout_seconds", &timeout_seconds);
  m.def("version", []() { return std::string(RONDE_VERSION_STRING); });
  // ronde.torch.elastic's changes of world: (epoch, old rank, old size,
  // rank, size, members at launch rank), as a C++ tuple, converted once
  // the GIL is held again.
  auto change_tuple = [](const elastic::WorldChange& c) {
    return std::make_tuple(
        c.epoch, c.old_rank, c.old_size, c.rank, c.size, c.members);
  };
  m.def(
      "_change_world",
      [change_tuple](const std::vector<int>& suspects) {
        return change_tuple(elastic::change_world(suspects));
      },
      py::arg("suspect_ranks"),
      release_gil());
  m.def("_check_host_updates", &elastic::check_host_updates, release_gil());
  m.def(
      "_admit_joiners",
      [change_tuple]() { return change_tuple(elastic::admit_joiners()); },
      release_gil());
  m.def("_joining", &elastic::joining);
  m.def(
      "_join_world",
      [change_tuple]() { return change_tuple(elastic::join_world()); },
      release_gil());
  m.def("_close_to_joiners", &elastic::close_to_joiners, release_gil());
}

}  // namespace ronde::detail
