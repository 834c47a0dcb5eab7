// The small model the optimizer scenarios train, on the CPU and on the GPU:
// tanh MLP in -> hidden -> hidden [-> hidden] -> out. The "extra" layer is
// always registered; with use_extra false it gets no gradient, which is how
// the scenarios test unused parameters.
#pragma once

#include <torch/torch.h>

namespace ronde::testing {

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in, int64_t hidden, int64_t out, bool use_extra)
      : use_extra_(use_extra) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    extra = register_module("extra", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(fc1->forward(x));
    x = torch::tanh(fc2->forward(x));
    if (use_extra_)
      x = torch::tanh(extra->forward(x));
    return fc3->forward(x);
  }
  bool use_extra_;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, extra{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

}  // namespace ronde::testing
