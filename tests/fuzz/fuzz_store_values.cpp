// What any process that reaches the store can write where ranks read
// (runtime/auth.h, runtime/records.h): sealed values, the identity record,
// peer and progress records. Each decoder gives a value or a reason.
#include "runtime/auth.h"
#include "runtime/records.h"

#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  using namespace ronde::detail;
  static const Key32 job = job_key_from_secret("fuzzing secret, 16+", "job");
  static const Key32 run = run_key(job, "challenge");
  std::string why;
  if (auto v = open_value(run, "ronde/job/peer/1", bytes, why)) {
    try {
      (void)decode_peer(v->payload, 1);
    } catch (const std::runtime_error&) {
    }
  }
  const IdentityRecord id = decode_identity(bytes);
  (void)identity_verifies(id, job);
  try {
    (void)decode_peer(bytes, 3);
  } catch (const std::runtime_error&) {
  }
  (void)decode_progress(bytes);
  (void)from_hex(bytes);
  return 0;
}
