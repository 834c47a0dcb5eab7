// Every rank's text, through two allgathers (lengths, then bytes): what
// the checks that compare whole lists across ranks exchange (process-set
// requests in comm/, parameter lists in engine/).
#pragma once

#include <ronde/collectives.h>

#include <string>
#include <vector>

namespace ronde::detail {

// `mine` from this rank, every rank's in the set's rank order; `options`
// name the collectives and pick the set.
std::vector<std::string> allgather_texts(
    const std::string& mine, const CollectiveOptions& options);

}  // namespace ronde::detail
