// Peer and progress records, strictly parsed.
#include "runtime/records.h"

#include <charconv>
#include <stdexcept>
#include <vector>

namespace ronde::detail {
namespace {

// A base-10 integer in [lo, hi] spanning all of `s`.
std::optional<int64_t> whole_number(
    const std::string& s, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc() || p != end || v < lo || v > hi)
    return std::nullopt;
  return v;
}

// Longer than any host identity, address or source ronde writes.
constexpr size_t kMaxField = 4096;

}  // namespace

std::string encode_peer(const PeerInfo& p) {
  return p.host + "\n" + p.address.address + "\n" + p.address.source + "\n" +
         std::to_string(p.local_rank) + "\n" + std::to_string(p.local_size) +
         "\n" + std::to_string(p.cross_rank) + "\n" +
         std::to_string(p.cross_size) + "\n" + p.launcher;
}

PeerInfo decode_peer(const std::string& text, int rank) {
  auto bad = [rank](const std::string& why) {
    return std::runtime_error(
        "rank " + std::to_string(rank) + "'s rendezvous record is malformed (" +
        why + "; another ronde version?)");
  };
  std::vector<std::string> f;
  size_t start = 0;
  for (;;) {
    size_t nl = text.find('\n', start);
    f.push_back(text.substr(start, nl - start));
    if (f.back().size() > kMaxField)
      throw bad("a field of " + std::to_string(f.back().size()) + " bytes");
    if (nl == std::string::npos || f.size() > 8)
      break;
    start = nl + 1;
  }
  if (f.size() != 8)
    throw bad("not 8 lines");
  auto number = [&](size_t i, int64_t lo, const char* what) {
    auto v = whole_number(f[i], lo, 1 << 24);
    if (!v)
      throw bad(std::string(what) + " '" + f[i].substr(0, 32) + "'");
    return static_cast<int>(*v);
  };
  PeerInfo p;
  p.host = f[0];
  p.address = {f[1], f[2]};
  p.local_rank = number(3, 0, "local rank");
  p.local_size = number(4, 1, "local size");
  p.cross_rank = number(5, 0, "cross rank");
  p.cross_size = number(6, 1, "cross size");
  p.launcher = f[7];
  return p;
}

std::string encode_progress(const ProgressRecord& p) {
  return std::to_string(p.started) + "|" + p.what;
}

std::optional<ProgressRecord> decode_progress(const std::string& text) {
  const size_t bar = text.find('|');
  if (bar == std::string::npos)
    return std::nullopt;
  auto n = whole_number(text.substr(0, bar), 0, INT64_MAX);
  if (!n)
    return std::nullopt;
  ProgressRecord p;
  p.started = *n;
  p.what = text.substr(bar + 1, kMaxField);
  return p;
}

}  // namespace ronde::detail
