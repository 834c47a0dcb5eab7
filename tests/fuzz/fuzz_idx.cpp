// The examples' IDX reader (examples/common/fashion_mnist.h) on any file,
// plain or gzipped: an IdxArray or a std::runtime_error, never undefined
// behaviour or an allocation the file's size does not justify.
#include "fashion_mnist.h"

#include <sys/mman.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  // An in-memory file: nothing on disk.
  static const int fd = ::memfd_create("fuzz_idx", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, data + 1, size - 1, 0) != static_cast<ssize_t>(size - 1))
    return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    (void)examples::read_idx(path, 1 + data[0] % 3);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
