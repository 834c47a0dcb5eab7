// Checkpoint files as found on disk (train/checkpoint_file.h): any bytes,
// read without a key and with one, are a payload or a reason, never
// undefined behaviour.
#include "train/checkpoint_file.h"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file(reinterpret_cast<const char*>(data), size);
  // The seeds were written for step 8 under this key.
  const std::string key(32, 'k');
  std::string why;
  for (int64_t step : {int64_t{8}, int64_t{-1}}) {
    (void)ronde::detail::decode_checkpoint(file, step, "", why);
    (void)ronde::detail::decode_checkpoint(file, step, key, why);
  }
  return 0;
}
