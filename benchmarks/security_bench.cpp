// What authentication and encryption cost: a store value set and read back
// through the signed store against the plain TCPStore (one process, the
// server on loopback), and a checkpoint file encoded and decoded with and
// without a key. Rounds alternate between the two sides; medians; JSON on
// stdout.
//
//   security_bench [--store-ops N] [--checkpoint-mb M] [--rounds R]
#include "runtime/signed_store.h"
#include "train/checkpoint_file.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using ronde::detail::Key32;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per set + get of `bytes` bytes.
double store_round_trip(c10d::Store& store, size_t bytes, int ops) {
  const std::vector<uint8_t> value(bytes, 7);
  const auto t = Clock::now();
  for (int i = 0; i < ops; ++i) {
    const std::string key = "bench/" + std::to_string(i % 16);
    store.set(key, value);
    if (store.get(key).size() != bytes)
      std::abort();
  }
  return seconds_since(t) / ops * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  int store_ops = 2000, checkpoint_mb = 64, rounds = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--store-ops"))
      store_ops = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--checkpoint-mb"))
      checkpoint_mb = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      rounds = std::atoi(argv[i + 1]);
  }
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  so.port = server->getPort();
  so.isServer = false;
  auto plain = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const Key32 run = ronde::detail::run_key(
      ronde::detail::job_key_from_secret("a benchmark's secret", "bench"),
      "challenge");
  auto sealed =
      c10::make_intrusive<ronde::detail::SignedStore>(plain->clone(), run, 0);

  std::printf("{\n  \"benchmark\": \"security\",\n  \"rounds\": %d,\n", rounds);
  std::printf("  \"store\": [\n");
  const size_t sizes[] = {100, 4096};
  for (size_t s = 0; s < 2; ++s) {
    std::vector<double> a, b;
    for (int r = 0; r < rounds; ++r) {
      a.push_back(store_round_trip(*plain, sizes[s], store_ops));
      b.push_back(store_round_trip(*sealed, sizes[s], store_ops));
    }
    std::printf(
        "    {\"value_bytes\": %zu, \"plain_us\": %.2f, \"signed_us\": %.2f, "
        "\"signed_over_plain\": %.3f}%s\n",
        sizes[s],
        median(a),
        median(b),
        median(b) / median(a),
        s == 0 ? "," : "");
  }
  std::printf("  ],\n");

  const std::string payload(size_t(checkpoint_mb) << 20, 'x');
  const std::string key(32, 'k');
  std::vector<double> enc_plain, enc_key, dec_plain, dec_key;
  for (int r = 0; r < rounds; ++r) {
    for (int side = 0; side < 2; ++side) {
      const std::string& k = side == 0 ? std::string() : key;
      // As Checkpointer::save() does: the payload moved in, not copied.
      std::string moved = payload;
      auto t = Clock::now();
      auto encoded = ronde::detail::encode_checkpoint(8, std::move(moved), k);
      (side == 0 ? enc_plain : enc_key).push_back(seconds_since(t));
      std::string file = encoded.bytes();
      std::string why;
      t = Clock::now();
      auto back = ronde::detail::decode_checkpoint(std::move(file), 8, k, why);
      (side == 0 ? dec_plain : dec_key).push_back(seconds_since(t));
      if (!back || back->size() != payload.size())
        std::abort();
    }
  }
  const double mb = checkpoint_mb;
  std::printf(
      "  \"checkpoint\": {\"mb\": %d, \"encode_plain_mb_s\": %.0f, "
      "\"encode_encrypted_mb_s\": %.0f, \"decode_plain_mb_s\": %.0f, "
      "\"decode_encrypted_mb_s\": %.0f}\n}\n",
      checkpoint_mb,
      mb / median(enc_plain),
      mb / median(enc_key),
      mb / median(dec_plain),
      mb / median(dec_key));
  return 0;
}
