// The cross-rank check's descriptors as they arrive from the other ranks:
// raw bytes, copied into Descriptors and checked (comm/descriptor.h). Any
// bytes may end in a c10::Error (a mismatch, a complaint, a corrupt
// descriptor), never in undefined behaviour.
#include "comm/descriptor.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ronde::detail::Descriptor;
  if (size < 1)
    return 0;
  // The first byte: how many ranks (1-4) and which one is "me".
  const int ranks = 1 + data[0] % 4;
  const int me = (data[0] >> 2) % ranks;
  ++data;
  --size;
  std::vector<Descriptor> all(ranks);
  for (int r = 0; r < ranks; ++r) {
    // Each rank's bytes over a valid descriptor, as far as they go: the
    // fuzzer then spends its time past the magic number.
    const size_t at = r * sizeof(Descriptor);
    if (at < size)
      std::memcpy(&all[r], data + at, std::min(sizeof(Descriptor), size - at));
    (void)ronde::detail::fingerprint(all[r]);
    (void)ronde::detail::described_bytes(all[r]);
  }
  try {
    ronde::detail::check_descriptors(all, me);
  } catch (const c10::Error&) {
  }
  return 0;
}
