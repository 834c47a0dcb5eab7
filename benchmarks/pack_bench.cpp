// Bucket pack/unpack throughput against a plain copy of the same bytes, on
// the CPU or a CUDA device. DistributedOptimizer packs a bucket with
// ronde::detail::batched_copy (plugin/src/optim/batched_copy.h: one batched
// at::_foreach_copy_) of the parameters' gradients into their segments
// of the flat bucket buffer, and unpacks (gradients kept apart from the
// buckets) with the same call the other way; this measures exactly that
// code on a realistic mix of tensor sizes, and one contiguous copy of the
// same number of bytes as the baseline, alternately in the same run.
//   pack_bench [--device cpu|cuda] [--mb 64] [--repeats 21] [--json FILE]
#include "optim/batched_copy.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds for fn, timed between device synchronizations, over `iters` runs.
template <typename F>
double timed(const torch::Device& device, int iters, F&& fn) {
  if (device.is_cuda())
    torch::cuda::synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i)
    fn();
  if (device.is_cuda())
    torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
             .count() /
         iters;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = "cpu", json_path;
  double mb = 64;
  int repeats = 21;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      return i + 1 < argc ? std::string(argv[++i]) : std::string();
    };
    if (a == "--device")
      device_name = next();
    else if (a == "--mb")
      mb = std::stod(next());
    else if (a == "--repeats")
      repeats = std::stoi(next());
    else if (a == "--json")
      json_path = next();
    else {
      std::cerr << "usage: pack_bench [--device cpu|cuda] [--mb MB] "
                   "[--repeats N] [--json FILE]\n";
      return 2;
    }
  }
  TORCH_CHECK(
      device_name == "cpu" || device_name == "cuda",
      "unknown device ",
      device_name);
  TORCH_CHECK(
      device_name == "cpu" || torch::cuda::is_available(),
      "--device cuda, but no CUDA device is available");
  TORCH_CHECK(mb > 0 && repeats >= 1, "--mb and --repeats must be positive");
  const torch::Device device(
      device_name == "cuda" ? torch::kCUDA : torch::kCPU, 0);
  const auto opts = torch::TensorOptions().device(device);

  // Gradients shaped like a transformer block's and a CNN's: a few large
  // matrices, many vectors (biases, norms), until the bucket is full.
  const int64_t total = static_cast<int64_t>(mb * (1 << 20) / 4);
  const int64_t shapes[][2] = {
      {1024, 1024},
      {1024, 1},
      {4096, 1024},
      {4096, 1},
      {1024, 4096},
      {1024, 1},
      {1024, 1},
      {1024, 1},
      {64, 576},
      {64, 1}};
  std::vector<torch::Tensor> grads;
  int64_t used = 0;
  for (size_t i = 0; used < total; ++i) {
    const auto& s = shapes[i % (sizeof(shapes) / sizeof(shapes[0]))];
    const int64_t n = std::min(s[0] * s[1], total - used);
    grads.push_back(torch::randn({n}, opts));
    used += n;
  }
  torch::Tensor bucket = torch::empty({used}, opts);
  std::vector<torch::Tensor> views;
  int64_t offset = 0;
  for (const auto& g : grads) {
    views.push_back(bucket.narrow(0, offset, g.numel()));
    offset += g.numel();
  }
  torch::Tensor flat_src = torch::randn({used}, opts);
  torch::Tensor flat_dst = torch::empty({used}, opts);

  auto pack = [&] { ronde::detail::batched_copy(views, grads); };
  auto unpack = [&] { ronde::detail::batched_copy(grads, views); };
  auto copy = [&] { flat_dst.copy_(flat_src); };
  // Candidates measured beside it, for a whole bucket at once: LibTorch's
  // concatenation kernel into the bucket, and its split-and-copy back.
  std::vector<int64_t> sizes;
  for (const auto& g : grads)
    sizes.push_back(g.numel());
  auto pack_cat = [&] { at::cat_out(bucket, grads, 0); };
  auto unpack_split = [&] {
    at::split_with_sizes_copy_out(grads, bucket, sizes, 0);
  };
  // Correctness first: what is packed is what was there, by every method.
  const torch::Tensor want = torch::cat(grads);
  pack();
  TORCH_CHECK(torch::equal(bucket, want), "pack lost data");
  bucket.zero_();
  pack_cat();
  TORCH_CHECK(torch::equal(bucket, want), "cat pack lost data");
  for (auto& g : grads)
    g.zero_();
  unpack_split();
  TORCH_CHECK(torch::equal(torch::cat(grads), want), "split unpack lost data");
  for (auto& g : grads)
    g.zero_();
  unpack();
  TORCH_CHECK(torch::equal(torch::cat(grads), want), "unpack lost data");
  const int iters = device.is_cuda() ? 20 : 3;
  for (int w = 0; w < 2; ++w) {
    timed(device, 1, pack);
    timed(device, 1, unpack);
    timed(device, 1, copy);
    timed(device, 1, pack_cat);
    timed(device, 1, unpack_split);
  }
  std::vector<double> t_pack, t_unpack, t_copy, t_cat, t_split;
  for (int r = 0; r < repeats; ++r) {
    t_copy.push_back(timed(device, iters, copy));
    t_pack.push_back(timed(device, iters, pack));
    t_unpack.push_back(timed(device, iters, unpack));
    t_cat.push_back(timed(device, iters, pack_cat));
    t_split.push_back(timed(device, iters, unpack_split));
  }
  const double bytes = static_cast<double>(used) * 4;
  const double gb_copy = bytes / median(t_copy) / 1e9;
  const double gb_pack = bytes / median(t_pack) / 1e9;
  const double gb_unpack = bytes / median(t_unpack) / 1e9;
  const double gb_cat = bytes / median(t_cat) / 1e9;
  const double gb_split = bytes / median(t_split) / 1e9;
  std::printf(
      "pack_bench on %s: %zu tensors, %.1f MB: copy %.1f GB/s, pack %.1f GB/s "
      "(%.0f%%), unpack %.1f GB/s (%.0f%%)\n",
      device_name.c_str(),
      grads.size(),
      bytes / (1 << 20),
      gb_copy,
      gb_pack,
      100 * gb_pack / gb_copy,
      gb_unpack,
      100 * gb_unpack / gb_copy);
  std::printf(
      "  candidates: cat pack %.1f GB/s (%.0f%%), split unpack %.1f GB/s "
      "(%.0f%%)\n",
      gb_cat,
      100 * gb_cat / gb_copy,
      gb_split,
      100 * gb_split / gb_copy);
  if (!json_path.empty()) {
    std::ofstream(json_path)
        << "{\"device\":\"" << device_name << "\",\"tensors\":" << grads.size()
        << ",\"bytes\":" << static_cast<int64_t>(bytes)
        << ",\"repeats\":" << repeats << ",\"copy_gb_s\":" << gb_copy
        << ",\"pack_gb_s\":" << gb_pack << ",\"unpack_gb_s\":" << gb_unpack
        << ",\"pack_vs_copy\":" << gb_pack / gb_copy
        << ",\"unpack_vs_copy\":" << gb_unpack / gb_copy
        << ",\"cat_pack_vs_copy\":" << gb_cat / gb_copy
        << ",\"split_unpack_vs_copy\":" << gb_split / gb_copy << "}\n";
  }
  return 0;
}
