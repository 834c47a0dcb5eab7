// The RNG table of a checkpoint (see checkpoint_rng.h). Files written before
// device generators, or before ronde::join(), lack some entries: they are
// read as one row per rank, and without device states.
#include "train/checkpoint_rng.h"

#include <ronde/collectives.h>
#include <ronde/runtime.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>

namespace ronde::detail {
namespace {

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The generator of this rank's accelerator (ronde::device()), if it has one,
// as a fixed-size record: 8 bytes of length, then the state (CUDA's is 16
// bytes), so that ranks with and without a device gather alike.
constexpr int64_t kDeviceRngRecord = 128;

std::optional<c10::Device> rng_device() {
  if (!ronde::is_initialized())
    return std::nullopt;
  c10::Device d = ronde::device();
  if (d.is_cpu())
    return std::nullopt;
  return d;
}

at::Tensor device_rng_record() {
  at::Tensor record = at::zeros({kDeviceRngRecord}, at::kByte);
  auto d = rng_device();
  if (!d)
    return record;
  auto gen = at::globalContext().defaultGenerator(*d);
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state().contiguous();
  }
  const int64_t n = state.numel() * state.element_size();
  if (n > kDeviceRngRecord - 8)
    return record;  // unknown layout: not saved rather than cut
  std::memcpy(record.data_ptr(), &n, sizeof(n));
  std::memcpy(record.data_ptr<uint8_t>() + 8, state.data_ptr(), n);
  return record;
}

// False when the record is empty or this rank has no device.
bool set_device_rng_record(const at::Tensor& record) {
  auto d = rng_device();
  int64_t n = 0;
  std::memcpy(&n, record.data_ptr(), sizeof(n));
  if (!d || n <= 0 || n > kDeviceRngRecord - 8)
    return false;
  at::Tensor state = record.narrow(0, 8, n).clone();
  auto gen = at::globalContext().defaultGenerator(*d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
  return true;
}

}  // namespace

RngTable gather_rng_table(int rank, int64_t job_size) {
  RngTable t;
  t.cpu = cpu_rng_state().unsqueeze(0);
  t.device = device_rng_record().unsqueeze(0);
  t.ranks = at::full({1}, static_cast<int64_t>(rank), at::kLong);
  if (job_size > 1) {
    using ronde::CollectiveOptions;
    t.ranks = ronde::allgather(
        t.ranks, CollectiveOptions().name("ronde.checkpoint.rng_ranks"));
    t.cpu = ronde::allgather(
        t.cpu, CollectiveOptions().name("ronde.checkpoint.rng"));
    t.device = ronde::allgather(
        t.device, CollectiveOptions().name("ronde.checkpoint.rng_device"));
  }
  return t;
}

void write_rng_table(
    torch::serialize::OutputArchive& archive,
    const RngTable& table,
    int64_t job_size) {
  archive.write("ronde.rng_cpu", table.cpu);
  archive.write("ronde.rng_device", table.device);
  archive.write("ronde.rng_ranks", table.ranks);
  archive.write("ronde.job_size", at::full({1}, job_size, at::kLong));
}

void restore_rng_table(
    torch::serialize::InputArchive& archive,
    int rank,
    int64_t job_size,
    const std::string& where) {
  at::Tensor rng;
  archive.read("ronde.rng_cpu", rng);
  // Written before device generators were saved: absent.
  at::Tensor rng_dev;
  const bool has_dev = archive.try_read("ronde.rng_device", rng_dev);
  // Which rank each row is (written since join: a checkpoint saved while
  // ranks were in ronde::join() has rows of the others only), and the size
  // of the job that wrote it. Older files: one row per rank.
  at::Tensor rng_ranks, saved_job_size;
  const bool has_ranks = archive.try_read("ronde.rng_ranks", rng_ranks) &&
                         archive.try_read("ronde.job_size", saved_job_size);
  const int64_t written_by =
      has_ranks ? saved_job_size.item<int64_t>() : rng.size(0);
  if (written_by == job_size) {
    int64_t row = rank;
    if (has_ranks) {
      row = -1;
      for (int64_t i = 0; i < rng_ranks.numel(); ++i) {
        if (rng_ranks[i].item<int64_t>() == rank)
          row = i;
      }
    }
    if (row >= 0 && row < rng.size(0)) {
      set_cpu_rng_state(rng[row].clone());  // its own storage
      if (has_dev && rng_dev.size(0) == rng.size(0))
        set_device_rng_record(rng_dev[row].contiguous());
    } else {
      std::cerr << "ronde: rank " << rank << ": " << where
                << " was saved while this rank was in ronde::join(): its "
                   "random number generators are not restored"
                << std::endl;
    }
  } else if (rank == 0) {
    std::cerr << "ronde: " << where << " was written by " << written_by
              << " ranks, this job has " << job_size
              << ": random number generators are not restored" << std::endl;
  }
}

}  // namespace ronde::detail
