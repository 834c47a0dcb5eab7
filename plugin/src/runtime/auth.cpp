// HMAC-SHA256 keys from the job secret, the identity record and sealed
// store values.
#include "runtime/auth.h"

#include "runtime/launch_contract.h"
#include "runtime/posix_io.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ronde::detail {
namespace {

constexpr char kSealMagic[3] = {'R', 'S', '1'};
constexpr size_t kSealHeader = sizeof(kSealMagic) + 4 + 8;
constexpr size_t kTagBytes = 32;
// A secret or key file is a few dozen bytes; anything bigger than the
// launch contract's limit is a mistake (a wrong path), not a key.
constexpr size_t kMaxPrivateFileBytes = kMaxSecretBytes;

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

// What the tag of a sealed value covers: the store key with its length
// (so no key/payload boundary can be shifted), then the sealed bytes.
std::string tagged_text(const std::string& store_key, const std::string& body) {
  std::string t;
  put_u64(t, store_key.size());
  t += store_key;
  t += body;
  return t;
}

std::string identity_text(
    const std::string& job_id,
    const std::string& size,
    const std::string& challenge_hex) {
  return "ronde identity v1|" + job_id + "|" + size + "|" + challenge_hex;
}

}  // namespace

std::string read_private_file(
    const std::string& path, const std::string& what, size_t min_bytes) {
  auto fail = [&](const std::string& why) {
    return std::runtime_error(what + " '" + path + "' " + why);
  };
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    throw fail(std::string("cannot be opened: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    throw fail(
        std::string("may be read or written by others (mode ") + mode +
        "): make it private to its owner (chmod 600)");
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    ::close(fd);
    throw fail("belongs to another user");
  }
  std::string bytes;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw fail(std::string("cannot be read: ") + std::strerror(err));
    }
    if (n == 0)
      break;
    bytes.append(buf, static_cast<size_t>(n));
    if (bytes.size() > kMaxPrivateFileBytes) {
      ::close(fd);
      throw fail(
          "is larger than " + std::to_string(kMaxPrivateFileBytes) +
          " bytes: not a key");
    }
  }
  ::close(fd);
  while (!bytes.empty() && (bytes.back() == '\n' || bytes.back() == '\r' ||
                            bytes.back() == ' ' || bytes.back() == '\t')) {
    bytes.pop_back();
  }
  if (bytes.size() < min_bytes) {
    throw fail(
        "holds " + std::to_string(bytes.size()) + " bytes; at least " +
        std::to_string(min_bytes) +
        " are needed (make one with: openssl rand -hex 32)");
  }
  return bytes;
}

// The kernel's generator, as ronderun's job secret uses (posix_io.h).
std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && !read_urandom(out.data(), n)) {
    throw std::runtime_error("the system's random generator failed");
  }
  return out;
}

std::string to_hex(const std::string& bytes) {
  return hex_text(bytes.data(), bytes.size());
}

std::optional<std::string> from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0)
    return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0)
      return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

Key32 hmac_sha256(const std::string& key, const std::string& data) {
  Key32 out{};
  unsigned int len = 0;
  if (HMAC(
          EVP_sha256(),
          key.data(),
          static_cast<int>(key.size()),
          reinterpret_cast<const unsigned char*>(data.data()),
          data.size(),
          out.data(),
          &len) == nullptr ||
      len != out.size()) {
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  }
  return out;
}

Key32 hmac_sha256(const Key32& key, const std::string& data) {
  return hmac_sha256(
      std::string(reinterpret_cast<const char*>(key.data()), key.size()), data);
}

bool equal_tags(const std::string& a, const Key32& b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), b.size()) == 0;
}

Key32 job_key_from_secret(
    const std::string& secret, const std::string& job_id) {
  return hmac_sha256(secret, "ronde job key v1|" + job_id);
}

Key32 run_key(const Key32& job_key, const std::string& challenge) {
  return hmac_sha256(job_key, "ronde run key v1|" + challenge);
}

std::string encode_identity(
    const std::string& job_id,
    int size,
    const Key32* job_key,
    const std::string& challenge) {
  std::string text = job_id + "|" + std::to_string(size);
  if (job_key == nullptr)
    return text;
  const std::string hex = to_hex(challenge);
  const Key32 tag =
      hmac_sha256(*job_key, identity_text(job_id, std::to_string(size), hex));
  return text + "|hmac-sha256|" + hex + "|" +
         to_hex(std::string(
             reinterpret_cast<const char*>(tag.data()), tag.size()));
}

IdentityRecord decode_identity(const std::string& text) {
  // Split from the right: a job id may hold '|' (ronde's never do, but a
  // user's RONDE_JOB_ID can), the fields after it never do.
  IdentityRecord r;
  std::vector<std::string> tail;
  std::string rest = text;
  for (int i = 0; i < 4; ++i) {
    size_t bar = rest.rfind('|');
    if (bar == std::string::npos)
      break;
    tail.insert(tail.begin(), rest.substr(bar + 1));
    rest.resize(bar);
  }
  if (tail.size() == 4 && tail[1] == "hmac-sha256") {
    auto challenge = from_hex(tail[2]);
    auto tag = from_hex(tail[3]);
    r.job_id = rest;
    r.size = tail[0];
    r.authenticated = true;
    r.challenge = challenge.value_or("");
    r.tag = tag.value_or("");
    return r;
  }
  size_t bar = text.rfind('|');
  r.job_id = text.substr(0, bar);
  r.size = bar == std::string::npos ? "?" : text.substr(bar + 1);
  return r;
}

bool identity_verifies(const IdentityRecord& record, const Key32& job_key) {
  if (!record.authenticated || record.challenge.empty())
    return false;
  const Key32 tag = hmac_sha256(
      job_key,
      identity_text(record.job_id, record.size, to_hex(record.challenge)));
  return equal_tags(record.tag, tag);
}

std::string seal_value(
    const Key32& run_key,
    const std::string& store_key,
    const SealedValue& value) {
  std::string body(kSealMagic, sizeof kSealMagic);
  put_u32(body, static_cast<uint32_t>(value.writer));
  put_u64(body, value.sequence);
  body += value.payload;
  const Key32 tag = hmac_sha256(run_key, tagged_text(store_key, body));
  body.append(reinterpret_cast<const char*>(tag.data()), tag.size());
  return body;
}

std::optional<SealedValue> open_value(
    const Key32& run_key,
    const std::string& store_key,
    const std::string& bytes,
    std::string& why) {
  if (bytes.size() < kSealHeader + kTagBytes ||
      std::memcmp(bytes.data(), kSealMagic, sizeof kSealMagic) != 0) {
    why = "it is not sealed (written without this job's secret)";
    return std::nullopt;
  }
  const std::string body = bytes.substr(0, bytes.size() - kTagBytes);
  const std::string tag = bytes.substr(bytes.size() - kTagBytes);
  if (!equal_tags(tag, hmac_sha256(run_key, tagged_text(store_key, body)))) {
    why =
        "its tag does not verify (forged, moved from another key, or "
        "written in another run or job)";
    return std::nullopt;
  }
  SealedValue v;
  v.writer = static_cast<int32_t>(get_le(body, sizeof kSealMagic, 4));
  v.sequence = get_le(body, sizeof kSealMagic + 4, 8);
  v.payload = body.substr(kSealHeader);
  return v;
}

}  // namespace ronde::detail
