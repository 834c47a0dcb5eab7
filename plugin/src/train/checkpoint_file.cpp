// Checkpoint file framing and AES-256-GCM (OpenSSL's EVP interface).
#include "train/checkpoint_file.h"

#include "runtime/auth.h"

#include <openssl/evp.h>
#include <zlib.h>

#include <cstring>
#include <memory>
#include <stdexcept>

namespace ronde::detail {
namespace {

struct Header {
  char magic[8];
  uint64_t step;
  uint64_t size;
  uint32_t crc32;
  uint32_t cipher;
};
static_assert(sizeof(Header) == 32, "the header is 32 bytes on disk");
constexpr char kPlainMagic[8] = {'R', 'O', 'N', 'D', 'E', 'C', 'K', 1};
constexpr char kSealedMagic[8] = {'R', 'O', 'N', 'D', 'E', 'C', 'K', 2};
constexpr uint32_t kAes256Gcm = 1;
constexpr size_t kKeyIdBytes = 8, kNonceBytes = 12, kTagBytes = 16;
constexpr size_t kSealedPrefix =
    sizeof(Header) + kKeyIdBytes + kNonceBytes + kTagBytes;

uint32_t crc_of(const char* data, size_t n) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  // zlib's length is 32-bit: large payloads in pieces.
  while (n > 0) {
    const uInt part = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(data), part);
    data += part;
    n -= part;
  }
  return static_cast<uint32_t>(crc);
}

// Which key sealed a file, without revealing it: the first bytes of an
// HMAC under the key.
std::string key_id(const std::string& key) {
  const Key32 id = hmac_sha256(key, "ronde checkpoint key id v1");
  return std::string(reinterpret_cast<const char*>(id.data()), kKeyIdBytes);
}

// What the tag authenticates besides the ciphertext: the header (less its
// CRC, which is computed over the ciphertext afterwards), the key id and
// the nonce. `file` holds those at their places.
std::string associated_data(Header h, const std::string& file) {
  h.crc32 = 0;
  std::string aad(reinterpret_cast<const char*>(&h), sizeof h);
  aad.append(file, sizeof h, kKeyIdBytes + kNonceBytes);
  return aad;
}

using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, void (*)(EVP_CIPHER_CTX*)>;

CipherCtx new_ctx() {
  CipherCtx ctx(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free);
  if (!ctx)
    throw std::runtime_error("OpenSSL: cannot allocate a cipher context");
  return ctx;
}

// AES-256-GCM over `data` in place (GCM allows it), with `aad` as
// associated data: encrypting writes the tag, decrypting checks it. False
// when OpenSSL fails or, decrypting, the tag does not verify.
bool gcm_in_place(
    bool encrypt,
    const std::string& key,
    const char* nonce,
    const std::string& aad,
    char* data,
    size_t n,
    char* tag) {
  auto ctx = new_ctx();
  auto* c = ctx.get();
  const int enc = encrypt ? 1 : 0;
  auto* bytes = reinterpret_cast<unsigned char*>(data);
  int len = 0;
  if (EVP_CipherInit_ex(c, EVP_aes_256_gcm(), nullptr, nullptr, nullptr, enc) !=
          1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) !=
          1 ||
      EVP_CipherInit_ex(
          c,
          nullptr,
          nullptr,
          reinterpret_cast<const unsigned char*>(key.data()),
          reinterpret_cast<const unsigned char*>(nonce),
          enc) != 1 ||
      EVP_CipherUpdate(
          c,
          nullptr,
          &len,
          reinterpret_cast<const unsigned char*>(aad.data()),
          static_cast<int>(aad.size())) != 1) {
    return false;
  }
  // EVP takes int lengths: in pieces.
  for (size_t done = 0; done < n;) {
    const int part = static_cast<int>(std::min<size_t>(n - done, 1u << 30));
    if (EVP_CipherUpdate(c, bytes + done, &len, bytes + done, part) != 1 ||
        len != part) {
      return false;
    }
    done += static_cast<size_t>(part);
  }
  if (!encrypt &&
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) != 1) {
    return false;
  }
  unsigned char fin[32];
  if (EVP_CipherFinal_ex(c, fin, &len) != 1)
    return false;
  return !encrypt ||
         EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1;
}

}  // namespace

std::string read_checkpoint_key(const std::string& path) {
  std::string bytes = read_private_file(path, "the checkpoint key file", 32);
  if (bytes.size() == 32)
    return bytes;
  if (bytes.size() == 64) {
    if (auto raw = from_hex(bytes))
      return *raw;
  }
  throw std::runtime_error(
      "the checkpoint key file '" + path + "' holds " +
      std::to_string(bytes.size()) +
      " bytes: expected 32 bytes or 64 hex digits (make one with: openssl "
      "rand -hex 32)");
}

CheckpointFile encode_checkpoint(
    int64_t step, std::string payload, const std::string& key) {
  Header h{};
  h.step = static_cast<uint64_t>(step);
  h.size = payload.size();
  CheckpointFile out;
  if (key.empty()) {
    std::memcpy(h.magic, kPlainMagic, sizeof h.magic);
    h.crc32 = crc_of(payload.data(), payload.size());
    out.head.assign(reinterpret_cast<const char*>(&h), sizeof h);
    out.body = std::move(payload);
    return out;
  }
  if (key.size() != 32)
    throw std::runtime_error("a checkpoint key is 32 bytes");
  std::memcpy(h.magic, kSealedMagic, sizeof h.magic);
  h.cipher = kAes256Gcm;
  const std::string nonce = random_bytes(kNonceBytes);
  out.head.assign(kSealedPrefix, '\0');
  std::memcpy(out.head.data() + sizeof h, key_id(key).data(), kKeyIdBytes);
  std::memcpy(
      out.head.data() + sizeof h + kKeyIdBytes, nonce.data(), kNonceBytes);
  // The payload's own buffer becomes the ciphertext.
  out.body = std::move(payload);
  if (!gcm_in_place(
          /*encrypt=*/true,
          key,
          nonce.data(),
          associated_data(h, out.head),
          out.body.data(),
          out.body.size(),
          out.head.data() + sizeof h + kKeyIdBytes + kNonceBytes)) {
    throw std::runtime_error("OpenSSL: AES-256-GCM encryption failed");
  }
  // The CRC covers the ciphertext: a torn file is told apart from a
  // changed one before any decryption.
  h.crc32 = crc_of(out.body.data(), out.body.size());
  std::memcpy(out.head.data(), &h, sizeof h);
  return out;
}

std::optional<std::string> decode_checkpoint(
    std::string file,
    int64_t expected_step,
    const std::string& key,
    std::string& why) {
  Header h{};
  if (file.size() < sizeof h) {
    why = "torn: shorter than its header";
    return std::nullopt;
  }
  std::memcpy(&h, file.data(), sizeof h);
  const bool plain = std::memcmp(h.magic, kPlainMagic, sizeof h.magic) == 0;
  const bool sealed = std::memcmp(h.magic, kSealedMagic, sizeof h.magic) == 0;
  if (!plain && !sealed) {
    why = "not a ronde checkpoint (bad magic)";
    return std::nullopt;
  }
  if (static_cast<int64_t>(h.step) != expected_step) {
    why = "its header says step " + std::to_string(h.step);
    return std::nullopt;
  }
  const size_t prefix = plain ? sizeof h : kSealedPrefix;
  if (file.size() < prefix) {
    why = "torn: shorter than its header";
    return std::nullopt;
  }
  const size_t body = file.size() - prefix;
  if (h.size > body) {
    why = "torn: " + std::to_string(body) + " of " + std::to_string(h.size) +
          " payload bytes";
    return std::nullopt;
  }
  if (h.size < body) {
    why = "has bytes after its payload";
    return std::nullopt;
  }
  if (crc_of(file.data() + prefix, body) != h.crc32) {
    why = "corrupt: checksum mismatch";
    return std::nullopt;
  }
  if (plain) {
    if (!key.empty()) {
      why =
          "refused: it is not encrypted, but a checkpoint key is set (anyone "
          "could have written it)";
      return std::nullopt;
    }
    file.erase(0, prefix);
    return file;
  }
  if (key.empty()) {
    why =
        "encrypted: set its key (Checkpointer::key_file or "
        "RONDE_CHECKPOINT_KEY_FILE)";
    return std::nullopt;
  }
  if (h.cipher != kAes256Gcm) {
    why = "encrypted with an unknown cipher (" + std::to_string(h.cipher) + ")";
    return std::nullopt;
  }
  if (std::memcmp(file.data() + sizeof h, key_id(key).data(), kKeyIdBytes) !=
      0) {
    why = "refused: encrypted with another key";
    return std::nullopt;
  }
  std::string tag =
      file.substr(sizeof h + kKeyIdBytes + kNonceBytes, kTagBytes);
  bool ok = false;
  try {
    ok = gcm_in_place(
        /*encrypt=*/false,
        key,
        file.data() + sizeof h + kKeyIdBytes,
        associated_data(h, file),
        file.data() + prefix,
        body,
        tag.data());
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
  if (!ok) {
    why =
        "refused: its authentication tag does not verify (bytes changed "
        "since it was written)";
    return std::nullopt;
  }
  file.erase(0, prefix);
  return file;
}

}  // namespace ronde::detail
