// The Python extension ronde.torch._C: the runtime, the collectives on
// torch.Tensor, the gradient engine (GradientReducer) that the Python
// DistributedOptimizer drives, and the schedule arithmetic. The Python side
// (python/ronde/torch) builds the user-facing API on top of it.
//
// Every call that may wait on other ranks releases the GIL, so Python
// threads (and the autograd engine's callbacks) keep running meanwhile.
#include <ronde/ronde.h>

#include <pybind11/operators.h>
#include <torch/extension.h>

#include <chrono>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace py = pybind11;

namespace ronde {
namespace {

using release_gil = py::call_guard<py::gil_scoped_release>;

// ronde.torch.CommError, a RuntimeError carrying CommError's fields.
PyObject* comm_error_type = nullptr;

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
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

DistributedOptimizerOptions make_options(
    double fusion_threshold_mb,
    double first_bucket_mb,
    int64_t backward_passes_per_step,
    bool average_aggregated_gradients,
    ReduceOp op,
    double gradient_predivide_factor,
    bool gradient_as_bucket_view,
    Compression compression,
    bool rebuild_buckets,
    bool autotune,
    const ProcessSet& process_set,
    bool divide_by_set_size) {
  return DistributedOptimizerOptions()
      .fusion_threshold_mb(fusion_threshold_mb)
      .first_bucket_mb(first_bucket_mb)
      .backward_passes_per_step(backward_passes_per_step)
      .average_aggregated_gradients(average_aggregated_gradients)
      .op(op)
      .gradient_predivide_factor(gradient_predivide_factor)
      .gradient_as_bucket_view(gradient_as_bucket_view)
      .compression(compression)
      .rebuild_buckets(rebuild_buckets)
      .autotune(autotune)
      .process_set(process_set)
      .divide_by_set_size(divide_by_set_size);
}

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
}  // namespace ronde

PYBIND11_MODULE(_C, m) {
  using namespace ronde;
  m.doc() = "ronde's C++ core for PyTorch (use ronde.torch, not this module)";

  comm_error_type =
      PyErr_NewException("ronde.torch.CommError", PyExc_RuntimeError, nullptr);
  m.attr("CommError") = py::handle(comm_error_type);
  py::register_local_exception_translator(translate_exceptions);

  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("Sum", ReduceOp::Sum)
      .value("Average", ReduceOp::Average)
      .value("Min", ReduceOp::Min)
      .value("Max", ReduceOp::Max)
      .value("Product", ReduceOp::Product);
  py::enum_<Compression>(m, "Compression")
      .value("none", Compression::None)
      .value("fp16", Compression::FP16)
      .value("bf16", Compression::BF16);
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

  // Process sets, before anything that takes one as an argument.
  py::class_<ProcessSet>(m, "ProcessSet")
      .def(py::init<>())
      .def(py::init<std::vector<int>>(), py::arg("ranks"))
      .def_property_readonly("id", &ProcessSet::id)
      .def_property_readonly("process_set_id", &ProcessSet::id)
      .def_property_readonly("ranks", &ProcessSet::ranks)
      .def("included", &ProcessSet::included)
      .def("rank", &ProcessSet::rank)
      .def("size", &ProcessSet::size)
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

  // Runtime.
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
      [](const at::Tensor& t, const std::string& name, const ProcessSet& ps) {
        return allgather(t, named(name, ps));
      },
      py::arg("tensor"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "allgather_async",
      [](const at::Tensor& t, const std::string& name, const ProcessSet& ps) {
        return allgather_async(t, named(name, ps));
      },
      py::arg("tensor"),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
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
         const ProcessSet& ps) {
        return alltoall(t, alltoall_options(splits, name, ps));
      },
      py::arg("tensor"),
      py::arg("splits") = py::none(),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "alltoall_async",
      [](const at::Tensor& t,
         const std::optional<std::vector<int64_t>>& splits,
         const std::string& name,
         const ProcessSet& ps) {
        return alltoall_async(t, alltoall_options(splits, name, ps));
      },
      py::arg("tensor"),
      py::arg("splits") = py::none(),
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "reducescatter",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps) {
        return reducescatter(t, reducescatter_options(op, pre, post, name, ps));
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
      release_gil());
  m.def(
      "reducescatter_async",
      [](const at::Tensor& t,
         ReduceOp op,
         double pre,
         double post,
         const std::string& name,
         const ProcessSet& ps) {
        return reducescatter_async(
            t, reducescatter_options(op, pre, post, name, ps));
      },
      py::arg("tensor"),
      op_arg,
      py::arg("prescale_factor") = 1.0,
      py::arg("postscale_factor") = 1.0,
      py::arg("name") = "",
      py::arg("process_set") = ProcessSet(),
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

  // DistributedOptimizer's check: a parameter the optimizer steps but
  // nobody averages would let replicas drift apart.
  m.def("_check_optimizer_parameters", &check_param_groups_covered);

  // The gradient engine.
  py::class_<StepProfile>(m, "StepProfile")
      .def_readonly("hooks_before_launch", &StepProfile::hooks_before_launch)
      .def_readonly("hooks", &StepProfile::hooks)
      .def_readonly("wait_seconds", &StepProfile::wait_seconds);
  py::class_<GradientReducer>(m, "GradientReducer")
      .def(
          py::init([](const std::vector<std::string>& names,
                      const std::vector<at::Tensor>& params,
                      double fusion_threshold_mb,
                      double first_bucket_mb,
                      int64_t backward_passes_per_step,
                      bool average_aggregated_gradients,
                      ReduceOp op,
                      double gradient_predivide_factor,
                      bool gradient_as_bucket_view,
                      Compression compression,
                      bool rebuild_buckets,
                      bool autotune,
                      const ProcessSet& process_set,
                      bool divide_by_set_size) {
            return std::make_unique<GradientReducer>(
                names,
                params,
                make_options(
                    fusion_threshold_mb,
                    first_bucket_mb,
                    backward_passes_per_step,
                    average_aggregated_gradients,
                    op,
                    gradient_predivide_factor,
                    gradient_as_bucket_view,
                    compression,
                    rebuild_buckets,
                    autotune,
                    process_set,
                    divide_by_set_size));
          }),
          py::arg("names"),
          py::arg("parameters"),
          py::arg("fusion_threshold_mb") = 0.0,
          py::arg("first_bucket_mb") = 1.0,
          py::arg("backward_passes_per_step") = 1,
          py::arg("average_aggregated_gradients") = true,
          py::arg("op") = ReduceOp::Average,
          py::arg("gradient_predivide_factor") = 1.0,
          py::arg("gradient_as_bucket_view") = true,
          py::arg("compression") = Compression::None,
          py::arg("rebuild_buckets") = true,
          py::arg("autotune") = false,
          py::arg("process_set") = ProcessSet(),
          py::arg("divide_by_set_size") = false,
          release_gil())
      .def("synchronize", &GradientReducer::synchronize, release_gil())
      .def("synchronized", &GradientReducer::synchronized)
      .def("finish_step", &GradientReducer::finish_step)
      .def("skip_step", &GradientReducer::skip_step, release_gil())
      .def("gradient_buffers", &GradientReducer::gradient_buffers)
      .def("buckets", &GradientReducer::buckets)
      .def("last_step_profile", &GradientReducer::last_step_profile)
      // (bucket MiB, first bucket MiB, autotuned), and its setter: what
      // the Python optimizer's state_dict() keeps of autotune.
      .def(
          "bucket_sizing",
          [](const GradientReducer& r) {
            const BucketSizing b = r.bucket_sizing();
            return py::make_tuple(
                b.fusion_threshold_mb, b.first_bucket_mb, b.autotuned);
          })
      .def(
          "set_bucket_sizing",
          [](GradientReducer& r, double fusion, double first, bool tuned) {
            r.set_bucket_sizing(BucketSizing{fusion, first, tuned});
          },
          py::arg("fusion_threshold_mb"),
          py::arg("first_bucket_mb"),
          py::arg("autotuned"))
      .def("names", &GradientReducer::names)
      .def(
          "backward_passes_per_step",
          [](const GradientReducer& r) {
            return r.options().backward_passes_per_step();
          })
      // The engine's step (GradientReducer::step): `update(closure)` is the
      // Python optimizer's own step; `closure` the user's, or None. The GIL
      // is held only while Python code runs, not while waiting on ranks.
      .def(
          "step",
          [](GradientReducer& r,
             py::function update,
             py::object closure,
             bool synchronize) {
            // Python objects are captured by reference: copying them needs
            // the GIL, which the engine does not hold.
            GradientReducer::Closure user;
            if (!closure.is_none()) {
              user = [&closure]() -> at::Tensor {
                py::gil_scoped_acquire gil;
                py::object loss = closure();
                return loss.is_none() ? at::Tensor() : loss.cast<at::Tensor>();
              };
            }
            // The optimizer's step may return anything (a loss, a float,
            // None): kept as the Python object it is.
            py::object result = py::none();
            auto call_update =
                [&update, &result](GradientReducer::Closure synced) {
                  py::gil_scoped_acquire gil;
                  py::object c = py::none();
                  if (synced) {
                    c = py::cpp_function(
                        [synced]() { return synced(); },
                        py::call_guard<py::gil_scoped_release>());
                  }
                  result = update(c);
                  return at::Tensor();
                };
            {
              py::gil_scoped_release release;
              r.step(call_update, user, synchronize);
            }
            return result;
          },
          py::arg("update"),
          py::arg("closure") = py::none(),
          py::arg("synchronize") = true);

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
