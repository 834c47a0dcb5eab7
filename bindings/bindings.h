// The parts of the extension ronde.torch._C, one bind_* function per area,
// each adding its names to the module. ronde_python.cpp calls them in an
// order pybind11 needs: a class is registered before any default argument
// or signature that names it (ProcessSet before init() and the
// collectives).
//
// Only bind_collectives.cpp, bind_optimizer.cpp and bind_c10d.cpp pass
// tensors or torch's own types, so only they include torch/extension.h (its
// tensor casters), which costs tens of seconds to compile; the others need
// pybind11 and its STL casters alone, and cast no type that LibTorch gives a
// caster of its own.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace ronde::detail {

namespace py = pybind11;

// Every call that may wait on other ranks releases the GIL, so Python
// threads (and the autograd engine's callbacks) keep running meanwhile.
using release_gil = py::call_guard<py::gil_scoped_release>;

// ProcessSet and the functions that add, remove and list sets.
void bind_process_sets(py::module_& m);
// CommError and the translation of C++ errors, init(), shutdown() and the
// job's topology.
void bind_runtime(py::module_& m);
// ReduceOp, Handle, the collectives, join() and broadcast_parameters().
void bind_collectives(py::module_& m);
// Compression, StepProfile and GradientReducer, the engine the Python
// DistributedOptimizer drives.
void bind_optimizer(py::module_& m);
// The LR scaling, warmup and decay arithmetic shared with C++.
void bind_schedules(py::module_& m);
// The torch.distributed backend (ronde/c10d.h) and its creator.
void bind_c10d(py::module_& m);

}  // namespace ronde::detail
