// ronde.torch._C's gradient engine: Compression, StepProfile and
// GradientReducer, which the Python DistributedOptimizer drives (its
// buckets, its step with the Python optimizer's own step inside, its
// autotuned bucket sizes), and the check that every parameter the
// optimizer steps is averaged.
#include "bindings.h"

#include <ronde/collectives.h>
#include <ronde/comm_hook.h>
#include <ronde/gradient_reducer.h>
#include <ronde/process_set.h>

#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

namespace ronde::detail {
namespace {

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

// A hook written in Python: reduce() runs on the communication thread with
// the GIL taken for the call (pybind11's override does), so Python code
// costs a GIL acquisition per bucket and holds off other Python threads
// meanwhile; backward's own C++ work goes on.
class PyCommHook : public CommHook {
 public:
  std::string name() const override {
    PYBIND11_OVERRIDE_PURE(std::string, CommHook, name);
  }
  std::string describe() const override {
    PYBIND11_OVERRIDE(std::string, CommHook, describe);
  }
  void reduce(CommBucket& bucket) override {
    PYBIND11_OVERRIDE_PURE(void, CommHook, reduce, bucket);
  }
  void count(int64_t bytes) {
    count_bucket();
    count_bytes(bytes);
  }
};

void bind_comm_hooks(py::module_& m) {
  py::class_<CommBucket>(m, "CommBucket")
      .def_readonly("buffer", &CommBucket::buffer)
      .def_readonly("gradients", &CommBucket::gradients)
      .def_readonly("names", &CommBucket::names)
      .def_readonly("parameters", &CommBucket::parameters)
      .def_readonly("index", &CommBucket::index)
      .def_readonly("last", &CommBucket::last)
      .def_readonly("step", &CommBucket::step)
      .def_readonly("process_set", &CommBucket::process_set)
      // The all-reduce the engine would make, as keyword arguments of
      // ronde.torch.allreduce_().
      .def_property_readonly(
          "op", [](const CommBucket& b) { return b.options.op(); })
      .def_property_readonly(
          "prescale_factor",
          [](const CommBucket& b) { return b.options.prescale_factor(); })
      .def_property_readonly(
          "postscale_factor",
          [](const CommBucket& b) { return b.options.postscale_factor(); })
      .def_property_readonly(
          "name", [](const CommBucket& b) { return b.options.name(); });
  py::class_<CommHook, PyCommHook, std::shared_ptr<CommHook>>(m, "CommHook")
      .def(py::init<>())
      .def("name", &CommHook::name)
      .def("describe", &CommHook::describe)
      .def("reduce", &CommHook::reduce, release_gil())
      .def("bytes_sent", &CommHook::bytes_sent)
      .def("buckets_reduced", &CommHook::buckets_reduced)
      // For a Python hook's reduce(): counts one bucket and the bytes it
      // handed to collectives.
      .def("count", [](CommHook& h, int64_t bytes) {
        auto* py_hook = dynamic_cast<PyCommHook*>(&h);
        TORCH_CHECK(py_hook, "ronde: count() is for hooks written in Python");
        py_hook->count(bytes);
      });
  m.def("allreduce_hook", &allreduce_hook);
  m.def("fp16_compress_hook", &fp16_compress_hook);
  m.def("bf16_compress_hook", &bf16_compress_hook);
  m.def(
      "powersgd_hook",
      [](int64_t rank,
         int64_t start_iter,
         double min_compression_rate,
         bool error_feedback,
         bool warm_start,
         double orthogonalization_epsilon,
         uint64_t seed) {
        return powersgd_hook(
            PowerSGDOptions()
                .rank(rank)
                .start_iter(start_iter)
                .min_compression_rate(min_compression_rate)
                .error_feedback(error_feedback)
                .warm_start(warm_start)
                .orthogonalization_epsilon(orthogonalization_epsilon)
                .seed(seed));
      },
      py::arg("rank") = 1,
      py::arg("start_iter") = 1000,
      py::arg("min_compression_rate") = 2.0,
      py::arg("error_feedback") = true,
      py::arg("warm_start") = true,
      py::arg("orthogonalization_epsilon") = 0.0,
      py::arg("seed") = 0);
}

}  // namespace

void bind_optimizer(py::module_& m) {
  bind_comm_hooks(m);
  py::enum_<Compression>(m, "Compression")
      .value("none", Compression::None)
      .value("fp16", Compression::FP16)
      .value("bf16", Compression::BF16);

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
                      bool divide_by_set_size,
                      bool shard_optimizer_state,
                      bool shard_gradients,
                      std::shared_ptr<CommHook> comm_hook) {
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
                    divide_by_set_size)
                    .shard_optimizer_state(shard_optimizer_state)
                    .shard_gradients(shard_gradients)
                    .comm_hook(std::move(comm_hook)));
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
          py::arg("shard_optimizer_state") = false,
          py::arg("shard_gradients") = false,
          py::arg("comm_hook") = nullptr,
          release_gil())
      .def("comm_hook", &GradientReducer::comm_hook)
      .def(
          "comm_hook_state",
          [](const GradientReducer& r) {
            return py::bytes(r.comm_hook_state());
          })
      .def(
          "load_comm_hook_state",
          [](GradientReducer& r, const py::bytes& b) {
            r.load_comm_hook_state(std::string(b));
          })
      .def("synchronize", &GradientReducer::synchronize, release_gil())
      .def("synchronized", &GradientReducer::synchronized)
      .def("finish_step", &GradientReducer::finish_step)
      .def("skip_step", &GradientReducer::skip_step, release_gil())
      .def("adapt_to_world", &GradientReducer::adapt_to_world, release_gil())
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
      // [(param, offset, numel, shard tensor)] for this rank.
      .def(
          "shards",
          [](const GradientReducer& r) {
            std::vector<py::tuple> out;
            for (const auto& s : r.shards())
              out.push_back(
                  py::make_tuple(s.param, s.offset, s.numel, s.tensor));
            return out;
          })
      .def("shards_changed", &GradientReducer::shards_changed)
      .def(
          "gradient_norm",
          &GradientReducer::gradient_norm,
          py::arg("norm_type") = 2.0,
          release_gil())
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
            auto call_update = [&update,
                                &result](GradientReducer::Closure synced) {
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
}

}  // namespace ronde::detail
