#include "engine/cross_rank_check.h"

#include "comm/text_exchange.h"

#include <ronde/collectives.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

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
  std::string joined;
  for (const auto& l : lines)
    joined += l + "\n";
  const std::vector<std::string> texts = allgather_texts(
      joined, CollectiveOptions().name(what + ".check").process_set(set));
  std::vector<std::vector<std::string>> per_rank;
  for (const std::string& text : texts) {
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
