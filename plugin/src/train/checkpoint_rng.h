// The random number generators a checkpoint holds: every rank's CPU
// generator and its accelerator's, with which rank each row is
// (`ronde.rng_ranks`) and the size of the job that wrote them
// (`ronde.job_size`), so that a rank-specific stream resumes where it was.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <string>

namespace ronde::detail {

// One row per rank that saved: a rank in ronde::join() sends none.
struct RngTable {
  at::Tensor cpu;     // the CPU generators' states
  at::Tensor device;  // the accelerators', as fixed-size records
  at::Tensor ranks;   // whose rows those are
};

// This rank's generators, gathered from every rank when `job_size` > 1.
// Collective then: every rank calls it.
RngTable gather_rng_table(int rank, int64_t job_size);

// The table's entries in `archive`, written by a job of `job_size` ranks.
void write_rng_table(
    torch::serialize::OutputArchive& archive,
    const RngTable& table,
    int64_t job_size);

// Sets this rank's generators from `archive`'s table when the job that
// wrote it had as many ranks as this one and saved a row for this rank;
// otherwise says on stderr that they are not restored. `where` names the
// checkpoint in that message.
void restore_rng_table(
    torch::serialize::InputArchive& archive,
    int rank,
    int64_t job_size,
    const std::string& where);

}  // namespace ronde::detail
