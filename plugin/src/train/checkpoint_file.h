// The bytes of a checkpoint file, apart from what they hold: the header,
// the CRC-32, and AES-256-GCM encryption with the header authenticated.
// No LibTorch: the decoder is fuzzed on its own (tests/fuzz).
//
//   plain:     header (magic "RONDECK\1", step, payload size, CRC-32 of the
//              payload, 0) + payload
//   encrypted: header (magic "RONDECK\2", step, ciphertext size, CRC-32 of
//              the ciphertext, 1 = AES-256-GCM) + key id (8) + nonce (12)
//              + tag (16) + ciphertext; the header (less the CRC, which is
//              over the ciphertext), key id and nonce are the cipher's
//              associated data, so changing any byte fails the tag or the
//              CRC.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ronde::detail {

// A checkpoint key from its file: 32 bytes, or 64 hex digits (openssl rand
// -hex 32), private to its owner. Throws std::runtime_error naming the file.
std::string read_checkpoint_key(const std::string& path);

// A checkpoint file as written: `head` then `body`, the payload itself or
// its ciphertext, so that a payload of gigabytes is never copied.
struct CheckpointFile {
  std::string head, body;
  std::string bytes() const {
    return head + body;
  }
};

// The file for `payload` as checkpoint `step`: encrypted under `key` (32
// bytes, with a fresh random nonce, in the payload's own buffer) unless
// `key` is empty.
CheckpointFile encode_checkpoint(
    int64_t step, std::string payload, const std::string& key);

// The payload of a checkpoint file's bytes, or nullopt with `why` set
// (torn, corrupt, another step, encrypted with another key, changed bytes,
// not encrypted though a key is given, ...). A key given refuses a plain
// file: anyone could have written it. Never throws on any bytes. The
// payload is `file`'s own buffer, decrypted in place.
std::optional<std::string> decode_checkpoint(
    std::string file,
    int64_t expected_step,
    const std::string& key,
    std::string& why);

}  // namespace ronde::detail
