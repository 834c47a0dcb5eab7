// Every rank's text through two allgathers: the exchange behind the checks
// that compare whole lists across ranks (comm/text_exchange.h).
#include "comm/text_exchange.h"

#include <ATen/ATen.h>

#include <cstring>

namespace ronde::detail {

std::vector<std::string> allgather_texts(
    const std::string& mine, const CollectiveOptions& o) {
  at::Tensor lengths =
      allgather(at::full({1}, static_cast<int64_t>(mine.size()), at::kLong), o);
  at::Tensor bytes = at::empty({static_cast<int64_t>(mine.size())}, at::kByte);
  if (!mine.empty())
    std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  at::Tensor all = allgather(bytes, o);
  std::vector<std::string> out;
  const char* p = static_cast<const char*>(all.data_ptr());
  for (int64_t r = 0; r < lengths.numel(); ++r) {
    const int64_t len = lengths[r].item<int64_t>();
    out.emplace_back(p, static_cast<size_t>(len));
    p += len;
  }
  return out;
}

}  // namespace ronde::detail
