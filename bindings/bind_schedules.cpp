// ronde.torch._C's schedule arithmetic, shared with C++ so both front ends
// agree: the LR scaling factor, the decay shapes and the warmup schedule's
// factor at a step.
#include "bindings.h"

#include <ronde/schedule.h>

#include <cstdint>

namespace ronde::detail {

void bind_schedules(py::module_& m) {
  py::enum_<LrScaling>(m, "LrScaling")
      .value("none", LrScaling::None)
      .value("linear", LrScaling::Linear)
      .value("sqrt", LrScaling::Sqrt);
  py::enum_<WarmupShape>(m, "WarmupShape")
      .value("linear", WarmupShape::Linear)
      .value("exponential", WarmupShape::Exponential)
      .value("constant", WarmupShape::Constant);
  py::enum_<DecayShape>(m, "DecayShape")
      .value("constant", DecayShape::Constant)
      .value("step", DecayShape::Step)
      .value("multi_step", DecayShape::MultiStep)
      .value("cosine", DecayShape::Cosine)
      .value("polynomial", DecayShape::Polynomial);

  // Schedule arithmetic, shared with C++ so both front ends agree.
  m.def(
      "lr_scale_factor",
      &lr_scale_factor,
      py::arg("scaling"),
      py::arg("replicas"),
      py::arg("backward_passes_per_step") = 1);
  py::class_<Decay>(m, "Decay")
      .def_static("constant", &Decay::constant)
      .def_static(
          "step", &Decay::step, py::arg("step_size"), py::arg("gamma") = 0.1)
      .def_static(
          "multi_step",
          &Decay::multi_step,
          py::arg("milestones"),
          py::arg("gamma") = 0.1)
      .def_static(
          "cosine",
          &Decay::cosine,
          py::arg("total_steps"),
          py::arg("floor_factor") = 0.0)
      .def_static(
          "polynomial",
          &Decay::polynomial,
          py::arg("total_steps"),
          py::arg("power") = 1.0,
          py::arg("floor_factor") = 0.0)
      .def_readonly("shape", &Decay::shape)
      .def_readonly("step_size", &Decay::step_size)
      .def_readonly("gamma", &Decay::gamma)
      .def_readonly("milestones", &Decay::milestones)
      .def_readonly("total_steps", &Decay::total_steps)
      .def_readonly("floor_factor", &Decay::floor_factor)
      .def_readonly("power", &Decay::power);
  m.def(
      "schedule_factor",
      [](int64_t warmup_steps,
         WarmupShape shape,
         const Decay& then,
         double multiplier,
         int64_t t) {
        return schedule_factor(
            WarmupOptions().warmup_steps(warmup_steps).shape(shape).then(then),
            multiplier,
            t);
      },
      py::arg("warmup_steps"),
      py::arg("shape"),
      py::arg("then"),
      py::arg("multiplier"),
      py::arg("t"));
}

}  // namespace ronde::detail
