#include "fashion_mnist.h"

#include <zlib.h>

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace examples {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

struct GzCloser {
  void operator()(gzFile_s* f) const {
    gzclose(f);
  }
};

// Reads exactly n bytes; returns how many were there before the end.
size_t read_some(gzFile f, const std::string& path, uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    unsigned chunk =
        static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    int got = gzread(f, out + done, chunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      fail(path, std::string("corrupt or unreadable (") + msg + ")");
    }
    if (got == 0) {
      break;
    }
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

IdxArray read_idx(const std::string& path, int expected_dims) {
  // gzread reads plain files as they are, so one path serves both.
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) {
    fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  }
  uint8_t magic[4];
  if (read_some(f.get(), path, magic, 4) != 4) {
    fail(path, "too short for an IDX header");
  }
  if (magic[0] != 0 || magic[1] != 0) {
    fail(path, "not an IDX file (bad magic number)");
  }
  if (magic[2] != 0x08) {
    fail(path, "IDX data type is not unsigned byte (0x08)");
  }
  if (magic[3] != expected_dims) {
    fail(
        path,
        "has " + std::to_string(magic[3]) + " dimensions, expected " +
            std::to_string(expected_dims));
  }
  IdxArray a;
  size_t total = 1;
  for (int d = 0; d < expected_dims; ++d) {
    uint8_t b[4];
    if (read_some(f.get(), path, b, 4) != 4) {
      fail(path, "truncated IDX header");
    }
    uint32_t v = (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) |
                 (uint32_t(b[2]) << 8) | uint32_t(b[3]);
    if (v == 0 || v > (1u << 28)) {
      fail(path, "implausible dimension " + std::to_string(v));
    }
    a.dims.push_back(v);
    total *= v;
    if (total > (size_t(1) << 34)) {
      fail(path, "implausibly large");
    }
  }
  // The header's dimensions are claims: memory follows the bytes that
  // are there, so a short file that claims gigabytes costs none.
  constexpr size_t kStep = size_t{16} << 20;
  size_t got = 0;
  while (got < total) {
    const size_t want = std::min(kStep, total - got);
    a.data.resize(got + want);
    const size_t n = read_some(f.get(), path, a.data.data() + got, want);
    got += n;
    if (n < want)
      break;
  }
  if (got != total) {
    fail(
        path,
        "truncated: " + std::to_string(got) + " of " + std::to_string(total) +
            " data bytes");
  }
  uint8_t extra;
  if (read_some(f.get(), path, &extra, 1) != 0) {
    fail(
        path,
        "has trailing bytes after " + std::to_string(total) + " data bytes");
  }
  return a;
}

namespace {

std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate :
       {dir + "/" + name, dir + "/" + name + ".gz"}) {
    if (exists(candidate)) {
      return candidate;
    }
  }
  throw std::runtime_error(
      "Fashion-MNIST file " + name + "[.gz] not found in " + dir +
      " (install Debian's dataset-fashion-mnist package, or pass --data DIR "
      "with the four IDX files)");
}

Split load_split(const std::string& dir, const std::string& prefix) {
  std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = read_idx(images_path, 3);
  IdxArray labels = read_idx(labels_path, 1);
  if (images.dims[1] != 28 || images.dims[2] != 28) {
    fail(
        images_path,
        "images are " + std::to_string(images.dims[1]) + "x" +
            std::to_string(images.dims[2]) + ", expected 28x28");
  }
  if (images.dims[0] != labels.dims[0]) {
    fail(
        labels_path,
        std::to_string(labels.dims[0]) + " labels for " +
            std::to_string(images.dims[0]) + " images in " + images_path);
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] > 9) {
      fail(
          labels_path,
          "label " + std::to_string(labels.data[i]) + " at index " +
              std::to_string(i) + " is not a class 0..9");
    }
  }
  Split s;
  s.count = images.dims[0];
  s.images = std::move(images.data);
  s.labels = std::move(labels.data);
  return s;
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir) {
  FashionMnist d;
  d.train = load_split(dir, "train");
  d.test = load_split(dir, "t10k");
  return d;
}

}  // namespace examples
