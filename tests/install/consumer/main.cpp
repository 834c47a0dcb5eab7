// Links against the installed ronde and runs one all-reduce.
#include <ronde/ronde.h>

#include <ATen/ATen.h>

#include <iostream>

int main() {
  ronde::init();
  at::Tensor t = at::full({4}, static_cast<float>(ronde::rank() + 1));
  at::Tensor sum =
      ronde::allreduce(t, ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  const int n = ronde::size();
  const float want = n * (n + 1) / 2.0f;
  bool ok = at::allclose(sum, at::full({4}, want));
  std::cout << "consumer rank " << ronde::rank() << " of " << n << " (ronde "
            << RONDE_VERSION_STRING << "): " << (ok ? "OK" : "WRONG")
            << std::endl;
  ronde::shutdown();
  return ok ? 0 : 1;
}
