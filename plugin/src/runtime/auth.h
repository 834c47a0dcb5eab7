// The job secret and what is made from it: the keys that authenticate the
// job's ranks and the values they trust from the store, and the sealed form
// of such a value. Cryptography is OpenSSL's (HMAC-SHA256, the system's
// random source); nothing here is home-made but the framing. No LibTorch:
// the decoders are fuzzed on their own (tests/fuzz).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace ronde::detail {

using Key32 = std::array<uint8_t, 32>;

// The bytes of a secret or key file: its owner only may read it (like
// ssh's private keys: a file others can read is refused), and it holds at
// least `min_bytes` bytes once trailing whitespace is dropped. Throws
// std::runtime_error naming `what`, the path and the problem.
std::string read_private_file(
    const std::string& path, const std::string& what, size_t min_bytes);

// `n` bytes from OpenSSL's random generator; throws when it fails.
std::string random_bytes(size_t n);

std::string to_hex(const std::string& bytes);
// nullopt unless `hex` is an even number of hex digits.
std::optional<std::string> from_hex(const std::string& hex);

Key32 hmac_sha256(const Key32& key, const std::string& data);
Key32 hmac_sha256(const std::string& key, const std::string& data);
// Compares in time that does not depend on where the bytes differ.
bool equal_tags(const std::string& a, const Key32& b);

// The key a job's ranks share: from the secret and the job id, so one
// secret used by two jobs gives each its own key.
Key32 job_key_from_secret(const std::string& secret, const std::string& job_id);
// The key of one run of the job: from the job key and the challenge rank 0
// made at this rendezvous, so values of an earlier run never verify.
Key32 run_key(const Key32& job_key, const std::string& challenge);

// ronde/identity, the record by which rank 0 tells what job the store
// serves: "<job id>|<size>" for an unauthenticated job, and
// "<job id>|<size>|hmac-sha256|<challenge hex>|<tag hex>" for one with a
// secret, the tag over the rest under the job key.
struct IdentityRecord {
  std::string job_id;
  std::string size;  // as written: compared, never parsed
  bool authenticated = false;
  std::string challenge;  // raw bytes
  std::string tag;        // raw bytes
};
std::string encode_identity(
    const std::string& job_id,
    int size,
    const Key32* job_key,
    const std::string& challenge);
// Never throws: fields missing from a malformed record are empty.
IdentityRecord decode_identity(const std::string& text);
// Whether `record` carries a tag `job_key` made.
bool identity_verifies(const IdentityRecord& record, const Key32& job_key);

// A value sealed for the store: "RS1", the writer's rank and sequence
// number, the payload, and an HMAC-SHA256 tag over the store key and all
// of that under the run key. The store key in the tag stops a value from
// being moved to another key; the run key, from being replayed into a
// later run; the sequence number, from being replayed over a newer value
// of the same writer.
struct SealedValue {
  int32_t writer = 0;
  uint64_t sequence = 0;
  std::string payload;
};
std::string seal_value(
    const Key32& run_key,
    const std::string& store_key,
    const SealedValue& value);
// The value, or nullopt with `why` set ("not sealed", "its tag does not
// verify", ...). Never throws and never reads past `bytes`.
std::optional<SealedValue> open_value(
    const Key32& run_key,
    const std::string& store_key,
    const std::string& bytes,
    std::string& why);

}  // namespace ronde::detail
