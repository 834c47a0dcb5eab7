// The Checkpointer: who saves (rank 0, after every rank's generators are
// gathered), how every rank learns the outcome (rank 0's verdict, broadcast),
// and restore (rank 0 reads, broadcasts the payload, each rank loads it).
// The files are in checkpoint_io.cpp, the generators in checkpoint_rng.cpp;
// see the Checkpointer's comment in ronde/checkpoint.h.
#include <ronde/amp.h>
#include <ronde/checkpoint.h>
#include <ronde/collectives.h>
#include <ronde/data.h>
#include <ronde/optimizer.h>
#include <ronde/runtime.h>
#include <ronde/schedule.h>

#include "runtime/settings.h"
#include "runtime/span.h"
#include "train/checkpoint_file.h"
#include "train/checkpoint_io.h"
#include "train/checkpoint_rng.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <sstream>

namespace ronde {

namespace {

constexpr size_t kStatusBytes = 512;

bool distributed() {
  return is_initialized() && size() > 1;
}

int my_rank() {
  return is_initialized() ? rank() : 0;
}

// Rank 0's verdict, broadcast to every rank: "" when all went well.
void agree_on_outcome(const std::string& rank0_error, const std::string& what) {
  if (distributed()) {
    auto status = at::zeros({static_cast<int64_t>(kStatusBytes)}, at::kByte);
    if (my_rank() == 0 && !rank0_error.empty()) {
      size_t n = std::min(rank0_error.size(), kStatusBytes - 1);
      std::memcpy(status.data_ptr<uint8_t>(), rank0_error.data(), n);
    }
    broadcast_(status, 0, CollectiveOptions().name("ronde.checkpoint." + what));
    std::string msg(reinterpret_cast<const char*>(status.data_ptr<uint8_t>()));
    TORCH_CHECK(
        msg.empty(), "Checkpointer: rank 0 failed to ", what, ": ", msg);
  } else {
    TORCH_CHECK(
        rank0_error.empty(),
        "Checkpointer: failed to ",
        what,
        ": ",
        rank0_error);
  }
}

}  // namespace

Checkpointer::Checkpointer(
    std::string dir, int64_t every_n_steps, int64_t keep_last)
    : dir_(std::move(dir)),
      every_n_steps_(every_n_steps),
      keep_last_(keep_last) {
  TORCH_CHECK(!dir_.empty(), "Checkpointer: the directory is empty");
  TORCH_CHECK(
      every_n_steps_ >= 0,
      "Checkpointer: every_n_steps must be >= 0, got ",
      every_n_steps_);
  TORCH_CHECK(
      keep_last_ >= 1,
      "Checkpointer: keep_last must be >= 1, got ",
      keep_last_);
  while (dir_.size() > 1 && dir_.back() == '/') {
    dir_.pop_back();
  }
  key_file_ = detail::settings().checkpoint_key_file;
}

Checkpointer& Checkpointer::key_file(std::string path) {
  key_file_ = std::move(path);
  key_.clear();
  return *this;
}

const std::string& Checkpointer::key() {
  if (key_.empty() && !key_file_.empty())
    key_ = detail::read_checkpoint_key(key_file_);
  return key_;
}

Checkpointer& Checkpointer::add_entry(Entry entry) {
  TORCH_CHECK(
      !entry.name.empty() && entry.name.rfind("ronde.", 0) != 0,
      "Checkpointer: bad entry name '",
      entry.name,
      "' (empty, or in ronde's own 'ronde.' namespace)");
  for (const auto& e : entries_) {
    TORCH_CHECK(
        e.name != entry.name, "Checkpointer: '", entry.name, "' added twice");
  }
  entries_.push_back(std::move(entry));
  return *this;
}

Checkpointer& Checkpointer::add(
    const std::string& name, torch::nn::Module& module) {
  // Values are copied into the existing tensors rather than swapped in as
  // Module::load() does (Tensor::set_, which gives each parameter a new
  // gradient accumulator): the DistributedOptimizer copes with that (it
  // re-hooks at the next step()), but copying keeps its hooks, and so the
  // overlap of the first resumed step.
  auto save = [&module](torch::serialize::OutputArchive& a) {
    for (const auto& p : module.named_parameters(/*recurse=*/true)) {
      a.write(p.key(), p.value().detach());
    }
    for (const auto& b : module.named_buffers(/*recurse=*/true)) {
      a.write(b.key(), b.value().detach(), /*is_buffer=*/true);
    }
  };
  auto load = [&module, name](torch::serialize::InputArchive& a) {
    torch::NoGradGuard no_grad;
    auto copy_in =
        [&](const std::string& key, const at::Tensor& dst, bool is_buffer) {
          at::Tensor src;
          TORCH_CHECK(
              a.try_read(key, src, is_buffer),
              "Checkpointer: '",
              name,
              "' has no saved value for '",
              key,
              "'");
          TORCH_CHECK(
              src.sizes() == dst.sizes(),
              "Checkpointer: '",
              name,
              "': '",
              key,
              "' was saved with shape ",
              src.sizes(),
              ", the model has ",
              dst.sizes());
          dst.copy_(src);
        };
    for (const auto& p : module.named_parameters(/*recurse=*/true)) {
      copy_in(p.key(), p.value(), false);
    }
    for (const auto& b : module.named_buffers(/*recurse=*/true)) {
      copy_in(b.key(), b.value(), true);
    }
  };
  return add_entry({name, save, load});
}

Checkpointer& Checkpointer::add(
    const std::string& name, torch::optim::Optimizer& optimizer) {
  return add_entry(
      {name,
       [&optimizer](auto& a) { optimizer.save(a); },
       [&optimizer](auto& a) { optimizer.load(a); },
       [&optimizer] {
         auto* d = dynamic_cast<DistributedOptimizer*>(&optimizer);
         if (d && (d->sharded() || d->comm_hook()->stateful()) &&
             d->options().process_set().included()) {
           d->consolidate_state_dict(0);
         }
       }});
}

Checkpointer& Checkpointer::add(
    const std::string& name, WarmupScheduler& scheduler) {
  return add_entry(
      {name,
       [&scheduler](auto& a) { scheduler.save(a); },
       [&scheduler](auto& a) { scheduler.load(a); }});
}

Checkpointer& Checkpointer::add(const std::string& name, GradScaler& scaler) {
  return add_entry(
      {name,
       [&scaler](auto& a) { scaler.save(a); },
       [&scaler](auto& a) { scaler.load(a); }});
}

Checkpointer& Checkpointer::add(
    const std::string& name, DistributedSampler& sampler) {
  return add_entry(
      {name,
       [&sampler](auto& a) { sampler.save(a); },
       [&sampler](auto& a) { sampler.load(a); }});
}

Checkpointer& Checkpointer::add(const std::string& name, int64_t& counter) {
  return add_entry(
      {name,
       [&counter](auto& a) { a.write("value", c10::IValue(counter)); },
       [&counter](auto& a) {
         c10::IValue v;
         a.read("value", v);
         counter = v.toInt();
       }});
}

Checkpointer& Checkpointer::add(
    const std::string& name,
    std::function<void(torch::serialize::OutputArchive&)> save,
    std::function<void(torch::serialize::InputArchive&)> load) {
  TORCH_CHECK(
      save && load, "Checkpointer: '", name, "' needs both save and load");
  return add_entry({name, std::move(save), std::move(load)});
}

void Checkpointer::write_entries(
    torch::serialize::OutputArchive& archive) const {
  for (const auto& e : entries_) {
    torch::serialize::OutputArchive sub;
    e.save(sub);
    archive.write(e.name, sub);
  }
}

void Checkpointer::read_entries(
    torch::serialize::InputArchive& archive, const std::string& where) {
  for (const auto& e : entries_) {
    torch::serialize::InputArchive sub;
    TORCH_CHECK(
        archive.try_read(e.name, sub),
        "ronde: rank ",
        my_rank(),
        ": ",
        where,
        " has no entry '",
        e.name,
        "'");
    e.load(sub);
  }
}

bool Checkpointer::maybe_save(int64_t step) {
  if (every_n_steps_ == 0 || step <= 0 || step % every_n_steps_ != 0) {
    return false;
  }
  save(step);
  return true;
}

std::vector<std::string> Checkpointer::list() const {
  return detail::list_checkpoints(dir_);
}

void Checkpointer::save(int64_t step) {
  TORCH_CHECK(step >= 0, "Checkpointer: the step must be >= 0, got ", step);
  detail::Span span(
      "ronde::checkpoint_save",
      "checkpoint save " + std::to_string(step),
      "checkpoint");
  const int64_t job_size = distributed() ? size() : 1;
  // Every rank's generator, so that a rank-specific random stream (dropout
  // seeded per rank) resumes where it was.
  const detail::RngTable rng = detail::gather_rng_table(my_rank(), job_size);
  for (const auto& e : entries_) {
    if (e.prepare)
      e.prepare();
  }
  std::string error;
  if (my_rank() == 0) {
    try {
      torch::serialize::OutputArchive archive;
      write_entries(archive);
      detail::write_rng_table(archive, rng, job_size);
      std::string payload;
      archive.save_to([&payload](const void* data, size_t n) {
        payload.append(static_cast<const char*>(data), n);
        return n;
      });
      const std::string& k = key();
      detail::write_checkpoint(
          dir_,
          step,
          detail::encode_checkpoint(step, std::move(payload), k),
          !k.empty());
      // Only now that the new one is durable: drop the oldest, and any
      // temporary file a killed writer left behind.
      detail::prune_checkpoints(dir_, keep_last_);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_on_outcome(
      error, "save checkpoint " + std::to_string(step) + " in '" + dir_ + "'");
}

std::optional<int64_t> Checkpointer::restore() {
  detail::Span span(
      "ronde::checkpoint_restore", "checkpoint restore", "checkpoint");
  std::string payload;
  int64_t step = -1;
  // Rank 0 reads the key; a key it cannot read fails every rank alike.
  std::string key_error;
  if (my_rank() == 0) {
    try {
      key();
    } catch (const std::exception& e) {
      key_error = e.what();
    }
  }
  agree_on_outcome(key_error, "read the checkpoint key");
  if (my_rank() == 0) {
    auto paths = list();
    for (auto it = paths.rbegin(); it != paths.rend(); ++it) {
      std::string why;
      auto name = it->substr(it->rfind('/') + 1);
      const int64_t file_step = detail::checkpoint_step_of(name);
      if (auto p = detail::read_checkpoint(*it, file_step, key_, why)) {
        payload = std::move(*p);
        step = file_step;
        break;
      }
      std::cerr << "ronde: rank 0: skipping checkpoint " << *it << ": " << why
                << std::endl;
    }
  }
  if (distributed()) {
    auto meta =
        at::tensor({step, static_cast<int64_t>(payload.size())}, at::kLong);
    broadcast_(meta, 0, CollectiveOptions().name("ronde.checkpoint.restore"));
    step = meta[0].item<int64_t>();
    auto bytes = at::empty({meta[1].item<int64_t>()}, at::kByte);
    if (my_rank() == 0 && !payload.empty()) {  // no data pointer when empty
      std::memcpy(bytes.data_ptr<uint8_t>(), payload.data(), payload.size());
    }
    if (step >= 0) {
      broadcast_(
          bytes, 0, CollectiveOptions().name("ronde.checkpoint.payload"));
      payload.assign(
          reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
          bytes.numel());
    }
  }
  if (step < 0) {
    return std::nullopt;
  }
  torch::serialize::InputArchive archive;
  {
    // From a stream, not from the flat buffer: LibTorch may then alias the
    // buffer's bytes in the loaded tensors (parameters included), and the
    // buffer dies with this function.
    std::istringstream stream(std::move(payload));
    archive.load_from(stream);
  }
  const std::string where =
      "checkpoint " + std::to_string(step) + " in '" + dir_ + "'";
  read_entries(archive, where);
  detail::restore_rng_table(
      archive, my_rank(), distributed() ? size() : 1, where);
  return step;
}

}  // namespace ronde
