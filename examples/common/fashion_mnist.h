// Reads Fashion-MNIST (or MNIST) from its IDX files, plain or gzipped:
// train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
// t10k-labels-idx1-ubyte (each optionally with .gz). No LibTorch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace examples {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kFashionMnistDir =
    "/usr/share/datasets/fashion-mnist";

inline constexpr const char* kFashionMnistClasses[10] = {
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot"};

// One IDX file of unsigned bytes: its dimensions and its data.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads an IDX file of unsigned bytes with `expected_dims` dimensions.
// Throws std::runtime_error naming the file and what is wrong with it
// (missing, not IDX, wrong type or rank, truncated, trailing bytes, corrupt
// gzip stream).
IdxArray read_idx(const std::string& path, int expected_dims);

struct Split {
  int64_t count = 0;
  std::vector<uint8_t> images;  // count x 28 x 28, row-major, 0..255
  std::vector<uint8_t> labels;  // count, 0..9
};

struct FashionMnist {
  Split train;
  Split test;
};

// Loads both splits from `dir`, taking `name` or `name.gz` for each file.
// Checks that images are 28x28, that each split has as many labels as
// images, and that labels are 0..9.
FashionMnist load_fashion_mnist(const std::string& dir);

}  // namespace examples
