// A checkpoint directory's files (see checkpoint_io.h). The write is durable
// before the old files go, so a crash at any point leaves a good checkpoint;
// encrypted files are 0600, see docs/security.md, "Encrypted checkpoints".
#include "train/checkpoint_io.h"

#include "runtime/posix_io.h"

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
#include <memory>

namespace ronde::detail {
namespace {

constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".ronde";
constexpr const char* kTmpSuffix = ".ronde.tmp";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%012" PRId64 "%s", kPrefix, step, kSuffix);
  return buf;
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

void write_all(int fd, const std::string& data, const std::string& path) {
  TORCH_CHECK(
      write_fully(fd, data.data(), data.size()),
      "cannot write '",
      path,
      "': ",
      errno_text());
}

}  // namespace

int64_t checkpoint_step_of(const std::string& name) {
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

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      int64_t step = checkpoint_step_of(e->d_name);
      if (step >= 0) {
        found.emplace_back(step, dir + "/" + e->d_name);
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

void write_checkpoint(
    const std::string& dir,
    int64_t step,
    const CheckpointFile& file,
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
    write_all(fd, file.head, tmp_path);
    write_all(fd, file.body, tmp_path);
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
  return decode_checkpoint(std::move(file), expected_step, key, why);
}

void prune_checkpoints(const std::string& dir, int64_t keep_last) {
  auto paths = list_checkpoints(dir);
  for (size_t i = 0; i + keep_last < paths.size(); ++i) {
    ::unlink(paths[i].c_str());
  }
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (ends_with(e->d_name, kTmpSuffix)) {
        ::unlink((dir + "/" + e->d_name).c_str());
      }
    }
    ::closedir(d);
  }
}

}  // namespace ronde::detail
