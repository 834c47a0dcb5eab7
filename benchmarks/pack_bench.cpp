// Bucket pack/unpack throughput against a plain copy of the same bytes, on
// the CPU or a CUDA device. DistributedOptimizer packs a bucket with
// ronde::detail::pack_segments and unpacks it with unpack_segments
// (plugin/src/engine/pack.h: on CUDA one concatenation or split when
// every segment is copied, as here; a multi-tensor copy otherwise); this
// measures exactly that code on a realistic mix of tensor sizes, both ways
// beside it, and one contiguous copy of the same number of bytes as the
// baseline, alternately in the same run.
//   pack_bench [--device cpu|cuda] [--mb 64] [--odd] [--repeats 21]
//              [--json FILE]
// --odd puts a 10-element tensor first, so that no later segment starts on
// a 16-byte boundary, as in models with small odd-sized layers.
#include "engine/pack.h"
#include "runtime/settings.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
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
  bool odd = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      return i + 1 < argc ? std::string(argv[++i]) : std::string();
    };
    if (a == "--device")
      device_name = next();
    else if (a == "--mb")
      mb = std::stod(next());
    else if (a == "--odd")
      odd = true;
    else if (a == "--repeats")
      repeats = std::stoi(next());
    else if (a == "--json")
      json_path = next();
    else {
      std::cerr << "usage: pack_bench [--device cpu|cuda] [--mb MB] [--odd] "
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
  if (odd) {
    grads.push_back(torch::randn({10}, opts));
    used += 10;
  }
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

  using namespace ronde::detail;
  // RONDE_BUCKET_COPY as the engine reads it.
  const std::optional<bool> setting = settings().bucket_copy_whole;
  TORCH_CHECK(
      fills_whole(bucket, views, grads),
      "the bucket should take the whole-bucket path");
  // What the engine does (one of the two ways below, by device).
  const std::function<void()> pack = [&] {
    pack_segments(bucket, views, grads, setting);
  };
  const std::function<void()> unpack = [&] {
    unpack_segments(bucket, views, grads, setting);
  };
  const std::function<void()> copy = [&] { flat_dst.copy_(flat_src); };
  // One concatenation or split of the whole bucket.
  const std::function<void()> pack_whole_fn = [&] {
    pack_whole(bucket, views, grads);
  };
  const std::function<void()> unpack_whole_fn = [&] {
    unpack_whole(bucket, views, grads);
  };
  // The multi-tensor copy.
  const std::function<void()> pack_foreach = [&] {
    batched_copy(views, grads);
  };
  const std::function<void()> unpack_foreach = [&] {
    batched_copy(grads, views);
  };
  // Correctness first: what is packed is what was there, by every method.
  const torch::Tensor want = torch::cat(grads);
  for (const auto* fn : {&pack, &pack_whole_fn, &pack_foreach}) {
    bucket.zero_();
    (*fn)();
    TORCH_CHECK(torch::equal(bucket, want), "pack lost data");
  }
  for (const auto* fn : {&unpack, &unpack_whole_fn, &unpack_foreach}) {
    for (auto& g : grads)
      g.zero_();
    (*fn)();
    TORCH_CHECK(torch::equal(torch::cat(grads), want), "unpack lost data");
  }

  const std::vector<const std::function<void()>*> methods = {
      &copy,
      &pack,
      &unpack,
      &pack_whole_fn,
      &unpack_whole_fn,
      &pack_foreach,
      &unpack_foreach};
  const int iters = device.is_cuda() ? 20 : 3;
  for (int w = 0; w < 2; ++w) {
    for (const auto* fn : methods)
      timed(device, 1, *fn);
  }
  std::vector<std::vector<double>> times(methods.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t m = 0; m < methods.size(); ++m)
      times[m].push_back(timed(device, iters, *methods[m]));
  }
  const double bytes = static_cast<double>(used) * 4;
  std::vector<double> gb;
  for (const auto& t : times)
    gb.push_back(bytes / median(t) / 1e9);
  const double gb_copy = gb[0], gb_pack = gb[1], gb_unpack = gb[2],
               gb_pack_whole = gb[3], gb_unpack_whole = gb[4],
               gb_pack_foreach = gb[5], gb_unpack_foreach = gb[6];
  const char* engine_way =
      prefers_whole(bucket, setting) ? "whole" : "multi-tensor";
  std::printf(
      "pack_bench on %s: %zu tensors, %.1f MB%s: copy %.1f GB/s, pack %.1f "
      "GB/s (%.0f%%), unpack %.1f GB/s (%.0f%%)\n",
      device_name.c_str(),
      grads.size(),
      bytes / (1 << 20),
      odd ? " (odd offsets)" : "",
      gb_copy,
      gb_pack,
      100 * gb_pack / gb_copy,
      gb_unpack,
      100 * gb_unpack / gb_copy);
  std::printf(
      "  engine's way: %s; whole bucket: pack %.0f%%, unpack %.0f%%; "
      "multi-tensor copy: pack %.0f%%, unpack %.0f%%\n",
      engine_way,
      100 * gb_pack_whole / gb_copy,
      100 * gb_unpack_whole / gb_copy,
      100 * gb_pack_foreach / gb_copy,
      100 * gb_unpack_foreach / gb_copy);
  if (!json_path.empty()) {
    std::ofstream(json_path)
        << "{\"device\":\"" << device_name << "\",\"tensors\":" << grads.size()
        << ",\"bytes\":" << static_cast<int64_t>(bytes)
        << ",\"odd_offsets\":" << (odd ? "true" : "false")
        << ",\"repeats\":" << repeats << ",\"copy_gb_s\":" << gb_copy
        << ",\"pack_gb_s\":" << gb_pack << ",\"unpack_gb_s\":" << gb_unpack
        << ",\"pack_vs_copy\":" << gb_pack / gb_copy
        << ",\"unpack_vs_copy\":" << gb_unpack / gb_copy << ",\"engine_way\":\""
        << engine_way << "\""
        << ",\"whole_pack_vs_copy\":" << gb_pack_whole / gb_copy
        << ",\"whole_unpack_vs_copy\":" << gb_unpack_whole / gb_copy
        << ",\"foreach_pack_vs_copy\":" << gb_pack_foreach / gb_copy
        << ",\"foreach_unpack_vs_copy\":" << gb_unpack_foreach / gb_copy
        << "}\n";
  }
  return 0;
}
