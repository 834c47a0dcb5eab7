// Which parameters share a fused all-reduce bucket. A pure function, so it is
// unit tested apart from autograd and the network.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace ronde::detail {

// `bytes[i]` and `keys[i]` describe parameter i, listed in the order their
// gradients are expected to become ready (reverse registration order).
// Parameters only share a bucket with the same key (dtype and device). A
// bucket is closed once it holds at least its cap: `first_cap` for the first
// bucket of each key (small, so communication starts early), `cap` after.
// A parameter of at least `alone` bytes gets a bucket of its own (the one
// open before it closes early). Returns buckets of parameter indices,
// ordered by their first index: the order in which every rank launches
// them.
std::vector<std::vector<size_t>> assign_buckets(
    const std::vector<size_t>& bytes,
    const std::vector<std::string>& keys,
    size_t first_cap,
    size_t cap,
    size_t alone = std::numeric_limits<size_t>::max());

}  // namespace ronde::detail
