// Links against the installed ronde::c10d: a c10d::ProcessGroup on ronde's
// backend, over a store of its own, runs one all-reduce on one rank.
#include <ronde/c10d.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <iostream>
#include <vector>

int main() {
  auto store = c10::make_intrusive<::c10d::HashStore>();
  auto pg = ronde::c10d::new_process_group(store, /*rank=*/0, /*size=*/1);
  std::vector<at::Tensor> tensors{at::full({4}, 3.0f)};
  pg->allreduce(tensors)->wait();
  const bool ok = at::allclose(tensors[0], at::full({4}, 3.0f)) &&
                  ronde::is_initialized() && ronde::size() == 1;
  std::cout << "consumer_c10d: " << (ok ? "OK" : "WRONG") << std::endl;
  ronde::shutdown();
  return ok ? 0 : 1;
}
