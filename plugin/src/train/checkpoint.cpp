#include <ronde/amp.h>
#include <ronde/checkpoint.h>
#include <ronde/collectives.h>
#include <ronde/data.h>
#include <ronde/runtime.h>
#include <ronde/schedule.h>

#include "runtime/settings.h"
#include "runtime/span.h"
#include "train/checkpoint_file.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>

namespace ronde {

namespace {

constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".ronde";
constexpr const char* kTmpSuffix = ".ronde.tmp";
constexpr size_t kStatusBytes = 512;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "ckpt-000000000042.ronde" -> 42; -1 for any other name.
int64_t step_of(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || !ends_with(name, kSuffix)) {
    return -1;
  }
  std::string digits = name.substr(
      std::strlen(kPrefix),
      name.size() - std::strlen(kPrefix) - std::strlen(kSuffix));
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) {
        return c >= '0' && c <= '9';
      })) {
    return -1;
  }
  return std::stoll(digits);
}

std::string file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%012" PRId64 "%s", kPrefix, step, kSuffix);
  return buf;
}

bool distributed() {
  return is_initialized() && size() > 1;
}

int my_rank() {
  return is_initialized() ? rank() : 0;
}

std::string errno_text() {
  return std::strerror(errno);
}

void make_dirs(const std::string& dir) {
  std::string path;
  size_t at = 0;
  while (at != std::string::npos) {
    at = dir.find('/', at + 1);
    path = dir.substr(0, at);
    if (path.empty()) {
      continue;
    }
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      TORCH_CHECK(
          false,
          "cannot create the checkpoint directory '",
          path,
          "': ",
          errno_text());
    }
  }
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    TORCH_CHECK(w > 0, "cannot write '", path, "': ", errno_text());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Writes checkpoint `step`'s file durably: temporary file (its owner's only
// when encrypted), fsync, rename, fsync of the directory.
void write_checkpoint(
    const std::string& dir,
    int64_t step,
    const detail::CheckpointFile& file,
    bool encrypted) {
  make_dirs(dir);
  const std::string final_path = dir + "/" + file_name(step);
  const std::string tmp_path = dir + "/" + file_name(step) + ".tmp";
  int fd = ::open(
      tmp_path.c_str(),
      O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
      encrypted ? 0600 : 0644);
  TORCH_CHECK(fd >= 0, "cannot create '", tmp_path, "': ", errno_text());
  try {
    write_all(fd, file.head.data(), file.head.size(), tmp_path);
    write_all(fd, file.body.data(), file.body.size(), tmp_path);
    TORCH_CHECK(
        ::fsync(fd) == 0, "cannot flush '", tmp_path, "': ", errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp_path.c_str());
    throw;
  }
  TORCH_CHECK(
      ::close(fd) == 0, "cannot close '", tmp_path, "': ", errno_text());
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp_path.c_str());
    TORCH_CHECK(
        false, "cannot rename '", tmp_path, "' to '", final_path, "': ", why);
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TORCH_CHECK(dfd >= 0, "cannot open '", dir, "': ", errno_text());
  int rc = ::fsync(dfd);
  ::close(dfd);
  TORCH_CHECK(
      rc == 0, "cannot flush the directory '", dir, "': ", errno_text());
}

// The payload of a checkpoint file, or an empty optional with `why` set.
std::optional<std::string> read_checkpoint(
    const std::string& path,
    int64_t expected_step,
    const std::string& key,
    std::string& why) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    why = "cannot open it: " + errno_text();
    return std::nullopt;
  }
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, &std::fclose);
  std::string file;
  struct stat st {};
  if (::fstat(::fileno(f), &st) == 0 && st.st_size > 0)
    file.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
    file.append(buf, n);
  if (std::ferror(f)) {
    why = "cannot read it: " + errno_text();
    return std::nullopt;
  }
  return detail::decode_checkpoint(std::move(file), expected_step, key, why);
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
  if (!is_initialized())
    return std::nullopt;
  c10::Device d = device();
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
       [&optimizer](auto& a) { optimizer.load(a); }});
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

bool Checkpointer::maybe_save(int64_t step) {
  if (every_n_steps_ == 0 || step <= 0 || step % every_n_steps_ != 0) {
    return false;
  }
  save(step);
  return true;
}

std::vector<std::string> Checkpointer::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  if (DIR* d = ::opendir(dir_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      int64_t step = step_of(e->d_name);
      if (step >= 0) {
        found.emplace_back(step, dir_ + "/" + e->d_name);
      }
    }
    ::closedir(d);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& f : found) {
    paths.push_back(std::move(f.second));
  }
  return paths;
}

void Checkpointer::save(int64_t step) {
  TORCH_CHECK(step >= 0, "Checkpointer: the step must be >= 0, got ", step);
  detail::Span span(
      "ronde::checkpoint_save",
      "checkpoint save " + std::to_string(step),
      "checkpoint");
  // Every rank's generator, so that a rank-specific random stream (dropout
  // seeded per rank) resumes where it was.
  auto rng = cpu_rng_state().unsqueeze(0);
  auto rng_dev = device_rng_record().unsqueeze(0);
  // Whose rows those are: a rank in ronde::join() sends none.
  auto rng_ranks = at::full({1}, static_cast<int64_t>(my_rank()), at::kLong);
  if (distributed()) {
    rng_ranks = allgather(
        rng_ranks, CollectiveOptions().name("ronde.checkpoint.rng_ranks"));
    rng = allgather(rng, CollectiveOptions().name("ronde.checkpoint.rng"));
    rng_dev = allgather(
        rng_dev, CollectiveOptions().name("ronde.checkpoint.rng_device"));
  }
  std::string error;
  if (my_rank() == 0) {
    try {
      torch::serialize::OutputArchive archive;
      for (const auto& e : entries_) {
        torch::serialize::OutputArchive sub;
        e.save(sub);
        archive.write(e.name, sub);
      }
      archive.write("ronde.rng_cpu", rng);
      archive.write("ronde.rng_device", rng_dev);
      archive.write("ronde.rng_ranks", rng_ranks);
      archive.write(
          "ronde.job_size",
          at::full({1}, distributed() ? size() : int64_t{1}, at::kLong));
      std::string payload;
      archive.save_to([&payload](const void* data, size_t n) {
        payload.append(static_cast<const char*>(data), n);
        return n;
      });
      const std::string& k = key();
      write_checkpoint(
          dir_,
          step,
          detail::encode_checkpoint(step, std::move(payload), k),
          !k.empty());
      // Only now that the new one is durable: drop the oldest, and any
      // temporary file a killed writer left behind.
      auto paths = list();
      for (size_t i = 0; i + keep_last_ < paths.size(); ++i) {
        ::unlink(paths[i].c_str());
      }
      if (DIR* d = ::opendir(dir_.c_str())) {
        while (dirent* e = ::readdir(d)) {
          if (ends_with(e->d_name, kTmpSuffix)) {
            ::unlink((dir_ + "/" + e->d_name).c_str());
          }
        }
        ::closedir(d);
      }
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
      if (auto p = read_checkpoint(*it, step_of(name), key_, why)) {
        payload = std::move(*p);
        step = step_of(name);
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
  for (const auto& e : entries_) {
    torch::serialize::InputArchive sub;
    TORCH_CHECK(
        archive.try_read(e.name, sub),
        "Checkpointer: rank ",
        my_rank(),
        ": ",
        where,
        " has no entry '",
        e.name,
        "'");
    e.load(sub);
  }
  at::Tensor rng;
  archive.read("ronde.rng_cpu", rng);
  const int64_t ranks = distributed() ? size() : 1;
  // Written before device generators were saved: absent.
  at::Tensor rng_dev;
  const bool has_dev = archive.try_read("ronde.rng_device", rng_dev);
  // Which rank each row is (written since join: a checkpoint saved while
  // ranks were in ronde::join() has rows of the others only), and the size
  // of the job that wrote it. Older files: one row per rank.
  at::Tensor rng_ranks, job_size;
  const bool has_ranks = archive.try_read("ronde.rng_ranks", rng_ranks) &&
      archive.try_read("ronde.job_size", job_size);
  const int64_t written_by =
      has_ranks ? job_size.item<int64_t>() : rng.size(0);
  if (written_by == ranks) {
    int64_t row = my_rank();
    if (has_ranks) {
      row = -1;
      for (int64_t i = 0; i < rng_ranks.numel(); ++i) {
        if (rng_ranks[i].item<int64_t>() == my_rank())
          row = i;
      }
    }
    if (row >= 0 && row < rng.size(0)) {
      set_cpu_rng_state(rng[row].clone());  // its own storage
      if (has_dev && rng_dev.size(0) == rng.size(0))
        set_device_rng_record(rng_dev[row].contiguous());
    } else {
      std::cerr << "ronde: rank " << my_rank() << ": " << where
                << " was saved while this rank was in ronde::join(): its "
                   "random number generators are not restored"
                << std::endl;
    }
  } else if (my_rank() == 0) {
    std::cerr << "ronde: " << where << " was written by " << written_by
              << " ranks, this job has " << ranks
              << ": random number generators are not restored" << std::endl;
  }
  return step;
}

}  // namespace ronde
