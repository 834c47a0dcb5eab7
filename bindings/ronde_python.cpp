// The Python extension ronde.torch._C: the runtime, the collectives on
// torch.Tensor, the gradient engine (GradientReducer) that the Python
// DistributedOptimizer drives, and the schedule arithmetic. The Python side
// (python/ronde/torch) builds the user-facing API on top of it. Each area
// is bound in its own file (bindings.h); this is the module definition.
#include "bindings.h"

PYBIND11_MODULE(_C, m) {
  using namespace ronde::detail;
  m.doc() = "ronde's C++ core for PyTorch (use ronde.torch, not this module)";
  // Process sets first: init() and the collectives take one as an argument.
  bind_process_sets(m);
  bind_runtime(m);
  bind_collectives(m);
  bind_optimizer(m);
  bind_schedules(m);
  bind_c10d(m);
}
