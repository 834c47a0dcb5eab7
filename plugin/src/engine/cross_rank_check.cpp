#include "engine/cross_rank_check.h"

#include <ronde/collectives.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <sstream>

namespace ronde::detail {

std::string describe_tensor(const std::string& name, const at::Tensor& t) {
  std::ostringstream os;
  os << "'" << name << "' " << t.scalar_type() << t.sizes() << " on "
     << t.device();
  return os.str();
}

std::string dtype_device_key(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << "@" << t.device();
  return os.str();
}

void check_same_everywhere(
    const std::string& what,
    const std::vector<std::string>& lines,
    const ProcessSet& set) {
  const int n = set.size();
  if (n == 1)
    return;
  const CollectiveOptions o =
      CollectiveOptions().name(what + ".check").process_set(set);
  std::string joined;
  for (const auto& l : lines)
    joined += l + "\n";
  at::Tensor mine = at::empty({static_cast<int64_t>(joined.size())}, at::kByte);
  if (!joined.empty())  // no data pointer when empty
    std::memcpy(mine.data_ptr(), joined.data(), joined.size());
  // Lengths first (one row each), so the texts can be split apart.
  at::Tensor lengths = ronde::allgather(
      at::full({1}, static_cast<int64_t>(joined.size()), at::kLong), o);
  at::Tensor all = ronde::allgather(mine, o);
  std::vector<std::vector<std::string>> per_rank;
  int64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    int64_t len = lengths[r].item<int64_t>();
    std::string text(static_cast<const char*>(all.data_ptr()) + offset, len);
    offset += len;
    std::vector<std::string> rows;
    std::istringstream is(text);
    for (std::string row; std::getline(is, row);)
      rows.push_back(row);
    per_rank.push_back(std::move(rows));
  }
  const std::vector<int> ranks = set.ranks();
  for (int r = 1; r < n; ++r) {
    const auto& a = per_rank[0];
    const auto& b = per_rank[r];
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      std::string x = i < a.size() ? a[i] : "nothing";
      std::string y = i < b.size() ? b[i] : "nothing";
      TORCH_CHECK(
          x == y,
          "ronde: ",
          what,
          ": ranks disagree (seen on rank ",
          ronde::rank(),
          "): at position ",
          i,
          " rank ",
          ranks[0],
          " has ",
          x,
          " but rank ",
          ranks[r],
          " has ",
          y,
          " (rank ",
          ranks[0],
          " has ",
          a.size(),
          ", rank ",
          ranks[r],
          " has ",
          b.size(),
          " in all)");
    }
  }
}

}  // namespace ronde::detail
