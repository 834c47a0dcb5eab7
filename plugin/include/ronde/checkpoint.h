// Coordinated checkpoints: rank 0 writes the training state atomically, every
// rank restores it from rank 0's copy, and a run killed at step k resumes to
// the same parameters as an uninterrupted run.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ronde {

class DistributedSampler;
class GradScaler;
class WarmupScheduler;
namespace elastic {
class State;
}

// Typical use:
//   ronde::Checkpointer ckpt("ckpt", /*every_n_steps=*/500, /*keep_last=*/3);
//   ckpt.add("model", *model).add("optimizer", opt).add("schedule", sched)
//       .add("sampler", sampler).add("step", step).add("epoch", epoch);
//   ckpt.restore();                 // at start-up: the newest good checkpoint
//   while (step < total) { ...; opt.step(); ++step; ckpt.maybe_save(step); }
//
// A checkpoint is one file, <dir>/ckpt-<step>.ronde: a header with the step,
// the payload size and a CRC-32 of the payload, then a LibTorch archive
// holding every added object under its name, plus every rank's CPU random
// number generator state. Rank 0 writes it to a temporary file, flushes and
// fsyncs it, renames it into place and fsyncs the directory; the other ranks
// wait until it is durable (and learn of a failure); only then are
// checkpoints beyond `keep_last` removed. restore() takes the newest file
// whose size and checksum are right, skipping torn or corrupt ones with a
// warning, and broadcasts it from rank 0, so only rank 0 needs the disk.
//
// Encrypted checkpoints: key_file(path), or RONDE_CHECKPOINT_KEY_FILE for
// every Checkpointer, names a file of 32 bytes or 64 hex digits (openssl
// rand -hex 32) private to its owner. Files are then AES-256-GCM encrypted
// with a fresh nonce each, header included in what the tag authenticates,
// and written with mode 0600; restore() refuses a file encrypted with
// another key, one with any byte changed, and a plain one (anyone could
// have written it), each with a warning, and falls back to the previous
// good checkpoint. Only rank 0 reads the key (it alone reads and writes
// files). See docs/security.md.
//
// save(), maybe_save() and restore() are collective: every rank calls them at
// the same steps. Added objects must outlive the checkpointer.
class Checkpointer {
 public:
  Checkpointer(std::string dir, int64_t every_n_steps, int64_t keep_last = 3);

  // Parameters and buffers.
  Checkpointer& add(const std::string& name, torch::nn::Module& module);
  // Any optimizer, a DistributedOptimizer included (its wrapped optimizer's
  // state and base LRs).
  Checkpointer& add(
      const std::string& name, torch::optim::Optimizer& optimizer);
  Checkpointer& add(const std::string& name, WarmupScheduler& scheduler);
  Checkpointer& add(const std::string& name, GradScaler& scaler);
  // The epoch and the position within it: a resumed epoch goes on where it
  // stopped (do not call set_epoch() again for that epoch).
  Checkpointer& add(const std::string& name, DistributedSampler& sampler);
  // A counter (step, epoch, ...).
  Checkpointer& add(const std::string& name, int64_t& counter);
  // Anything else, through its own save and load.
  Checkpointer& add(
      const std::string& name,
      std::function<void(torch::serialize::OutputArchive&)> save,
      std::function<void(torch::serialize::InputArchive&)> load);

  // Encrypts the files this writes and requires it of those it restores
  // (see above); an empty path turns encryption off. The file is read at
  // the first save() or restore().
  Checkpointer& key_file(std::string path);

  // Saves when `step` is a positive multiple of every_n_steps (0: never).
  // Returns whether it saved.
  bool maybe_save(int64_t step);
  // Saves now, as checkpoint `step`. Throws on every rank if rank 0 could
  // not write it (the previous checkpoints are then untouched).
  void save(int64_t step);
  // Loads the newest good checkpoint into every added object and returns its
  // step; std::nullopt (and nothing loaded) when there is none.
  std::optional<int64_t> restore();

  // Complete checkpoint files in the directory on this rank's disk, oldest
  // first.
  std::vector<std::string> list() const;
  const std::string& dir() const {
    return dir_;
  }

 private:
  // An elastic::State keeps its entries in a Checkpointer and commits them
  // to memory through these, not to files.
  friend class elastic::State;
  // Every added object into `archive`, each under its name.
  void write_entries(torch::serialize::OutputArchive& archive) const;
  // Every added object from `archive`; `where` names it in errors.
  void read_entries(
      torch::serialize::InputArchive& archive, const std::string& where);

  struct Entry {
    std::string name;
    std::function<void(torch::serialize::OutputArchive&)> save;
    std::function<void(torch::serialize::InputArchive&)> load;
    // Run on every rank before rank 0 saves (a sharded optimizer gathers
    // its state there); may be null.
    std::function<void()> prepare = nullptr;
  };
  Checkpointer& add_entry(Entry entry);
  // The key (32 bytes) from key_file_, read once; empty without one.
  const std::string& key();

  std::string dir_;
  int64_t every_n_steps_;
  int64_t keep_last_;
  std::vector<Entry> entries_;
  std::string key_file_;
  std::string key_;
};

}  // namespace ronde
