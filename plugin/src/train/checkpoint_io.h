// A checkpoint directory on rank 0's disk: the files' names, the durable
// write (temporary file, fsync, rename, fsync of the directory), reading a
// file back, and pruning. No collectives: checkpoint.cpp decides who calls.
#pragma once

#include "train/checkpoint_file.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ronde::detail {

// "ckpt-000000000042.ronde" -> 42; -1 for any other name.
int64_t checkpoint_step_of(const std::string& name);

// Complete checkpoint files in `dir`, oldest first (none if it is missing).
std::vector<std::string> list_checkpoints(const std::string& dir);

// Writes checkpoint `step`'s file durably, creating `dir` if needed; the
// file is its owner's only when `encrypted`. Throws, leaving no temporary
// file and the previous checkpoints untouched.
void write_checkpoint(
    const std::string& dir,
    int64_t step,
    const CheckpointFile& file,
    bool encrypted);

// The payload of the checkpoint file at `path`, or nullopt with `why` set.
std::optional<std::string> read_checkpoint(
    const std::string& path,
    int64_t expected_step,
    const std::string& key,
    std::string& why);

// Removes all but the newest `keep_last` checkpoints, and any temporary
// file a killed writer left behind.
void prune_checkpoints(const std::string& dir, int64_t keep_last);

}  // namespace ronde::detail
