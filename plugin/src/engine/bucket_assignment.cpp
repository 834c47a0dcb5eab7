// Greedy bucket assignment, as c10d's Reducer does it: fill per key in ready
// order, close at the cap.
#include "engine/bucket_assignment.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>

namespace ronde::detail {

std::vector<std::vector<size_t>> assign_buckets(
    const std::vector<size_t>& bytes,
    const std::vector<std::string>& keys,
    size_t first_cap,
    size_t cap,
    size_t alone) {
  TORCH_CHECK(
      bytes.size() == keys.size(),
      "assign_buckets: bytes and keys differ in length");
  struct Open {
    std::vector<size_t> members;
    size_t size = 0;
    bool first = true;
  };
  std::map<std::string, Open> open;
  std::vector<std::vector<size_t>> done;
  auto close = [&done](Open& b) {
    done.push_back(std::move(b.members));
    b.members.clear();
    b.size = 0;
    b.first = false;
  };
  for (size_t i = 0; i < bytes.size(); ++i) {
    Open& b = open[keys[i]];
    // Closed before a parameter that goes alone, so that it is the next
    // bucket's only member.
    if (bytes[i] >= alone && !b.members.empty())
      close(b);
    b.members.push_back(i);
    b.size += bytes[i];
    if (b.size >= (b.first ? first_cap : cap) || bytes[i] >= alone)
      close(b);
  }
  for (auto& [key, b] : open) {
    if (!b.members.empty())
      done.push_back(std::move(b.members));
  }
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) {
    return a.front() < b.front();
  });
  return done;
}

}  // namespace ronde::detail
