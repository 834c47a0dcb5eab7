// The job secret (see secret.h): read a given one, or make a private one.
#include "secret.h"

#include "runtime/launch_contract.h"
#include "runtime/posix_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace ronde::detail {

std::string JobSecret::prepare(
    const char* given, bool remote, const char* tmpdir) {
  if (given != nullptr && *given != '\0') {
    file_ = given;
    return remote ? read_given(given) : "";
  }
  return make_fresh(tmpdir);
}

std::string JobSecret::read_given(const char* given) {
  int fd = -1;
  do {
    fd = open(given, O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    return std::string("cannot read ") + kJobSecretFileVar + " '" + given +
           "': " + errno_text();
  }
  // A secret is a few dozen bytes; more would not fit the pipe that
  // carries it to each remote rank (spawn) without a reader.
  char buf[kMaxSecretBytes + 1];
  size_t got = 0;
  for (;;) {
    const ssize_t n = read(fd, buf + got, sizeof(buf) - got);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0 || (got += static_cast<size_t>(n)) == sizeof(buf)) {
      break;
    }
  }
  (void)close(fd);
  if (got > kMaxSecretBytes) {
    return std::string(kJobSecretFileVar) + " '" + given + "' is larger than " +
           std::to_string(kMaxSecretBytes) + " bytes: not a secret";
  }
  bytes_.assign(buf, got);
  return "";
}

std::string JobSecret::make_fresh(const char* tmpdir) {
  unsigned char random[32] = {};
  if (!read_urandom(random, sizeof(random))) {
    return "cannot read /dev/urandom to make the job secret";
  }
  bytes_ = hex_text(random, sizeof(random)) + "\n";
  const std::string dir_template =
      std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") +
      "/ronderun-XXXXXX";
  std::vector<char> dir(dir_template.begin(), dir_template.end());
  dir.push_back('\0');
  if (mkdtemp(dir.data()) == nullptr) {  // mode 0700
    return "cannot make a private directory for the job secret (" +
           dir_template + "): " + errno_text();
  }
  dir_ = dir.data();
  file_ = dir_ + "/secret";
  return write_file();
}

std::string JobSecret::write_file() {
  int fd = -1;
  do {
    fd = open(
        file_.c_str(),
        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
        0600);
  } while (fd < 0 && errno == EINTR);
  bool ok = fd >= 0 && write_fully(fd, bytes_.data(), bytes_.size());
  if (fd >= 0) {
    ok = close(fd) == 0 && ok;
  }
  if (ok) {
    return "";
  }
  const std::string error =
      "cannot write the job secret to " + file_ + ": " + errno_text();
  remove();
  return error;
}

void JobSecret::remove() {
  if (dir_.empty()) {
    return;
  }
  (void)unlink(file_.c_str());
  (void)rmdir(dir_.c_str());
  dir_.clear();
}

}  // namespace ronde::detail
