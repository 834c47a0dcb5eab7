// Serialised state as bytes, and their exchange over a process set: how
// sharded optimizer state and communication hooks' state reach the rank
// that saves a checkpoint.
#pragma once

#include <ronde/process_set.h>

#include <string>
#include <vector>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize

namespace ronde::detail {

// The archive's bytes (LibTorch's zip format), and back.
std::string bytes_of(torch::serialize::OutputArchive& archive);
void load_bytes(
    torch::serialize::InputArchive& archive, const std::string& bytes);

// Every rank's blob (allgather) or, with root >= 0, root's only (the others
// get an empty list): a gather to one rank.
std::vector<std::string> exchange_blobs(
    const std::string& mine, const ProcessSet& set, int root);

}  // namespace ronde::detail
