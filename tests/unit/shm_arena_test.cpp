// The shared-memory arena and the zero-copy all-reduce, reduce-scatter and
// all-gather: allocation, reuse and a directory without room; buffers that
// outlive their transport; and all-reduces, reduce-scatters and all-gathers
// of buffers in the arenas (every rank's, some ranks', at different
// offsets), with and without a postscale, equal bit for bit to the copying
// ones of the same values (and a multiplication after it), which
// tests/multirank checks against references.
#include "comm/shm/shm_arena.h"
#include "comm/shm/shm_transport.h"
#include "shm_job.h"

#include <gtest/gtest.h>

#include <sys/mount.h>

#include <cstring>
#include <string>
#include <vector>

namespace shm = ronde::detail::shm;
using ronde::detail::DType;
using ronde::detail::Reduction;
using namespace ronde::testing::shm_job;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// `split`: every all-reduce not read in place reduce-scatters and
// all-gathers; else, between two ranks, each reduces the whole buffer.
shm::Options arena_options(const Job& job, int r, int n, bool split = true) {
  shm::Options o = job.options(r, n);
  if (split)
    o.split_bytes = 0;
  o.zero_copy_min_bytes = 0;  // every size is read in place
  o.arena_bytes = 4 * kMiB;
  return o;
}

TEST(ShmArena, AllocatesFirstFitReusesAndRefusesWhenFull) {
  Job job;
  job.start(1, [&](int) {
    auto t = shm::Transport::connect(
        arena_options(job, 0, 1), file_rendezvous(job.rv_dir));
    shm::Arena& a = *t->arena();
    if (a.bytes() != 4 * kMiB)
      return 10;
    auto x = a.allocate(100);  // one page
    auto y = a.allocate(kMiB);
    auto z = a.allocate(5 * kMiB);  // more than is left
    if (!x || !y || *x != 0 || *y != 4096 || z)
      return 11;
    std::memset(a.base() + *x, 7, 100);
    a.release(*x, 100);
    // The hole is reused, and reads as zeros again.
    auto w = a.allocate(4096);
    if (!w || *w != 0 || a.base()[5] != 0)
      return 12;
    a.release(*w, 4096);
    a.release(*y, kMiB);
    if (a.in_use() != 0)
      return 13;
    // Coalesced: the whole arena in one piece again.
    auto all = a.allocate(4 * kMiB);
    if (!all || *all != 0 || !a.offset_of(a.base() + 8, 8) ||
        a.offset_of(a.base() + 4 * kMiB - 4, 8))
      return 14;
    return 0;
  });
  EXPECT_EQ(job.wait(), std::vector<int>({0}));
  EXPECT_TRUE(entries(job.shm_dir).empty());
}

TEST(ShmArena, DirectoryWithoutRoomRefusesTheBufferNotTheJob) {
  Job job;
  const std::string small = make_dir("/tmp");
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=4m,mode=0700") != 0) {
    ::rmdir(small.c_str());
    GTEST_SKIP() << "cannot mount a small tmpfs (needs root)";
  }
  job.start(1, [&](int) {
    shm::Options o = arena_options(job, 0, 1);
    o.dir = small;
    o.arena_bytes = 64 * kMiB;  // address space only: larger than the mount
    auto t = shm::Transport::connect(o, file_rendezvous(job.rv_dir));
    // 8 MiB cannot be reserved in 4, 1 MiB can.
    if (t->arena()->allocate(8 * kMiB))
      return 10;
    auto fits = t->arena()->allocate(kMiB);
    if (!fits)
      return 11;
    std::memset(t->arena()->base() + *fits, 1, kMiB);  // no SIGBUS
    return 0;
  });
  EXPECT_EQ(job.wait(), std::vector<int>({0}));
  EXPECT_TRUE(entries(small).empty());
  ::umount(small.c_str());
  ::rmdir(small.c_str());
}

TEST(ShmArena, BuffersOutliveTheirTransport) {
  Job job;
  job.start(1, [&](int) {
    std::shared_ptr<shm::Arena> arena;
    size_t at = 0;
    {
      auto t = shm::Transport::connect(
          arena_options(job, 0, 1), file_rendezvous(job.rv_dir));
      arena = t->arena();
      at = *arena->allocate(kMiB);
    }
    std::memset(arena->base() + at, 3, kMiB);  // still mapped
    arena->release(at, kMiB);
    return arena->in_use() == 0 ? 0 : 10;
  });
  EXPECT_EQ(job.wait(), std::vector<int>({0}));
  EXPECT_TRUE(entries(job.shm_dir).empty());
}

TEST(ShmArena, AllreducesBelowTheZeroCopySizeAreCopied) {
  Job job;
  const int n = 2;
  job.start(n, [&](int r) {
    shm::Options o = arena_options(job, r, n);
    o.zero_copy_min_bytes = 8192;  // per rank
    auto t = shm::Transport::connect(o, file_rendezvous(job.rv_dir));
    shm::Arena& a = *t->arena();
    for (size_t count : {size_t{1024}, size_t{2048}}) {
      const size_t at = *a.allocate(count * 4);
      auto* x = reinterpret_cast<float*>(a.base() + at);
      for (size_t i = 0; i < count; ++i)
        x[i] = static_cast<float>(r + i);
      const uint64_t before = t->zero_copy_allreduces();
      t->allreduce(x, count, DType::F32, Reduction::Sum);
      // 4 KiB through the slots; 8 KiB read in place.
      if (t->zero_copy_allreduces() != before + (count == 2048 ? 1 : 0))
        return 10;
      for (size_t i = 0; i < count; ++i) {
        if (x[i] != static_cast<float>(2 * i + 1))
          return 11;
      }
      a.release(at, count * 4);
    }
    return 0;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
}

// How the ranks place their buffers in one case of the tests below.
enum class Placement { All, AllShifted, OnlyRank1, None };
constexpr Placement kPlacements[] = {
    Placement::All,
    Placement::AllShifted,
    Placement::OnlyRank1,
    Placement::None};

// Whether every rank's buffer is in its arena: the in-place path.
bool all_in_arenas(Placement p) {
  return p == Placement::All || p == Placement::AllShifted;
}

// Rank r's buffer of `bytes` (of n ranks) for one placement: in the arena
// where the placement puts it, after a page of padding on the last rank
// when shifted (its buffer then sits one allocation further on), else in
// plain zeroed memory. Released when it goes.
class Placed {
 public:
  Placed(shm::Arena& a, Placement p, int r, int n, size_t bytes)
      : arena_(a), bytes_(bytes), plain_(bytes) {
    if (p == Placement::AllShifted && r == n - 1)
      pad_ = a.allocate(4096);
    want_ = bytes > 0 &&
            (all_in_arenas(p) || (p == Placement::OnlyRank1 && r == 1));
    if (want_)
      at_ = a.allocate(bytes);
  }
  ~Placed() {
    if (at_)
      arena_.release(*at_, bytes_);
    if (pad_)
      arena_.release(*pad_, 4096);
  }
  Placed(const Placed&) = delete;
  Placed& operator=(const Placed&) = delete;
  // False when the arena had no room for it.
  bool ok() const {
    return !want_ || at_.has_value();
  }
  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(at_ ? arena_.base() + *at_ : plain_.data());
  }

 private:
  shm::Arena& arena_;
  size_t bytes_;
  std::vector<char> plain_;
  std::optional<size_t> pad_, at_;
  bool want_ = false;
};

float value(int rank, size_t i) {
  return static_cast<float>(rank + 1) * 0.1f * static_cast<float>(i % 13) +
         1e-3f * static_cast<float>(i % 5);
}

// 3 ranks that split, and 2 that reduce whole (where a rank whose buffer
// is read in place makes the step split).
class ZeroCopy : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCopy, AllreduceEqualsTheCopyingOne) {
  Job job;
  const int n = GetParam();
  job.start(n, [&](int r) {
    auto t = shm::Transport::connect(
        arena_options(job, r, n, /*split=*/n > 2), file_rendezvous(job.rv_dir));
    shm::Arena& a = *t->arena();
    // Around the 4096-byte chunk (1024 floats), and many chunks.
    for (size_t count :
         {size_t{1}, size_t{1000}, size_t{5000}, size_t{70001}}) {
      for (Placement p : kPlacements) {
        Placed placed(a, p, r, n, count * sizeof(float));
        if (!placed.ok())
          return 10;
        float* buf = placed.data<float>();
        for (size_t i = 0; i < count; ++i)
          buf[i] = value(r, i);
        const uint64_t before = t->zero_copy_allreduces();
        t->allreduce(buf, count, DType::F32, Reduction::Sum);
        // Without a copy exactly when every rank's buffer is in its arena.
        if (t->zero_copy_allreduces() != before + (all_in_arenas(p) ? 1 : 0))
          return 14;
        // The copying all-reduce of the same values: the same bits.
        std::vector<float> copy(count);
        for (size_t i = 0; i < count; ++i)
          copy[i] = value(r, i);
        t->allreduce(copy.data(), count, DType::F32, Reduction::Sum);
        for (size_t i = 0; i < count; ++i) {
          float want = value(0, i) + value(1, i);
          if (n > 2)
            want += value(2, i);
          if (buf[i] != want || std::memcmp(&buf[i], &copy[i], 4) != 0) {
            std::fprintf(
                stderr,
                "rank %d: count %zu placement %d element %zu: %g, want %g\n",
                r,
                count,
                static_cast<int>(p),
                i,
                buf[i],
                want);
            return 11;
          }
        }
      }
    }
    // A postscale is taken as x * float(scale) after the sum, as at::mul_
    // takes it: in the arenas, through the slots, and reduced whole.
    shm::Options o = job.options(r, n);
    o.arena_bytes = 0;
    auto whole = shm::Transport::connect(o, file_rendezvous(job.rv_dir, "w"));
    const double third = 1.0 / 3.0;
    for (Placement p : {Placement::All, Placement::None}) {
      for (size_t count : {size_t{1000}, size_t{70001}}) {
        Placed placed(a, p, r, n, count * sizeof(float));
        if (!placed.ok())
          return 10;
        float* buf = placed.data<float>();
        std::vector<float> copy(count), small(count);
        for (size_t i = 0; i < count; ++i)
          buf[i] = copy[i] = small[i] = value(r, i);
        t->allreduce(buf, count, DType::F32, Reduction::Sum, third);
        whole->allreduce(
            small.data(), count, DType::F32, Reduction::Sum, third);
        t->allreduce(copy.data(), count, DType::F32, Reduction::Sum);
        for (size_t i = 0; i < count; ++i) {
          const float want = copy[i] * static_cast<float>(third);
          if (std::memcmp(&buf[i], &want, 4) != 0 ||
              std::memcmp(&small[i], &want, 4) != 0)
            return 15;
        }
      }
    }
    std::vector<double> d(3000, r + 0.25), dcopy(d);
    t->allreduce(d.data(), d.size(), DType::F64, Reduction::Sum, third);
    t->allreduce(dcopy.data(), d.size(), DType::F64, Reduction::Sum);
    for (size_t i = 0; i < d.size(); ++i) {
      const double want = dcopy[i] * third;
      if (std::memcmp(&d[i], &want, 8) != 0)
        return 16;
    }
    // bf16 is accumulated in float and rounded once, in the arena too.
    const size_t count = 3000;
    auto at = a.allocate(count * 2);
    auto* h = reinterpret_cast<uint16_t*>(a.base() + *at);
    std::vector<uint16_t> copy(count);
    for (size_t i = 0; i < count; ++i)
      h[i] = copy[i] = static_cast<uint16_t>(0x3f80 + (i % 97) + r * 3);
    t->allreduce(h, count, DType::BF16, Reduction::Sum);
    t->allreduce(copy.data(), count, DType::BF16, Reduction::Sum);
    if (std::memcmp(h, copy.data(), count * 2) != 0)
      return 12;
    a.release(*at, count * 2);
    t->barrier();
    return a.in_use() == 0 ? 0 : 13;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
  EXPECT_TRUE(entries(job.shm_dir).empty());
}

// Each rank reduces its block from every rank's input where it lies when
// every input is in its arena; else as the copying reduce-scatter, reading
// the inputs that are. Blocks of unequal sizes; each rank scribbles over its
// input as soon as the call returns, which must not reach a peer's result.
TEST_P(ZeroCopy, ReduceScatterEqualsTheCopyingOne) {
  Job job;
  const int n = GetParam();
  job.start(n, [&](int r) {
    auto t = shm::Transport::connect(
        arena_options(job, r, n), file_rendezvous(job.rv_dir));
    shm::Arena& a = *t->arena();
    for (size_t base : {size_t{1}, size_t{1000}, size_t{70001}}) {
      std::vector<size_t> counts(n);
      size_t total = 0, first = 0;
      for (int q = 0; q < n; ++q) {
        counts[q] = base + static_cast<size_t>(q) * 7;
        first += q < r ? counts[q] : 0;
        total += counts[q];
      }
      for (Placement p : kPlacements) {
        Placed placed(a, p, r, n, total * sizeof(float));
        if (!placed.ok())
          return 10;
        float* in = placed.data<float>();
        std::vector<float> out(counts[r]), copy_out(counts[r]);
        for (size_t i = 0; i < total; ++i)
          in[i] = value(r, i);
        const uint64_t before = t->zero_copy_reduce_scatters();
        t->reduce_scatter(
            in, out.data(), counts.data(), DType::F32, Reduction::Sum);
        for (size_t i = 0; i < total; ++i)
          in[i] = -1e30f;
        if (t->zero_copy_reduce_scatters() !=
            before + (all_in_arenas(p) ? 1 : 0))
          return 14;
        std::vector<float> copy(total);
        for (size_t i = 0; i < total; ++i)
          copy[i] = value(r, i);
        t->reduce_scatter(
            copy.data(),
            copy_out.data(),
            counts.data(),
            DType::F32,
            Reduction::Sum);
        for (size_t i = 0; i < counts[r]; ++i) {
          float want = value(0, first + i) + value(1, first + i);
          if (n > 2)
            want += value(2, first + i);
          if (out[i] != want || std::memcmp(&out[i], &copy_out[i], 4) != 0) {
            std::fprintf(
                stderr,
                "rank %d: base %zu placement %d element %zu: %g, want %g\n",
                r,
                base,
                static_cast<int>(p),
                i,
                out[i],
                want);
            return 11;
          }
        }
      }
    }
    t->barrier();
    return a.in_use() == 0 ? 0 : 13;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
  EXPECT_TRUE(entries(job.shm_dir).empty());
}

// Each rank writes its block into every rank's output when every output is
// in its arena; else through the slots. Blocks of unequal sizes, zero
// bytes included; every output is checked as soon as the call returns.
TEST_P(ZeroCopy, AllgatherEqualsTheCopyingOne) {
  Job job;
  const int n = GetParam();
  job.start(n, [&](int r) {
    auto t = shm::Transport::connect(
        arena_options(job, r, n), file_rendezvous(job.rv_dir));
    shm::Arena& a = *t->arena();
    for (size_t base : {size_t{0}, size_t{1000}, size_t{300001}}) {
      std::vector<size_t> bytes(n);
      size_t total = 0;
      for (int q = 0; q < n; ++q) {
        bytes[q] = base + static_cast<size_t>(q) * 12;
        total += bytes[q];
      }
      std::vector<char> in(bytes[r]), want(total);
      for (size_t i = 0; i < bytes[r]; ++i)
        in[i] = static_cast<char>((i * 7 + r * 31) % 251);
      for (int q = 0, at = 0; q < n; at += bytes[q], ++q) {
        for (size_t i = 0; i < bytes[q]; ++i)
          want[at + i] = static_cast<char>((i * 7 + q * 31) % 251);
      }
      for (Placement p : kPlacements) {
        Placed placed(a, p, r, n, total);
        if (!placed.ok())
          return 10;
        char* out = placed.data<char>();
        std::memset(out, 0x55, total);
        const uint64_t before = t->zero_copy_allgathers();
        t->allgatherv(in.data(), out, bytes.data());
        if (std::memcmp(out, want.data(), total) != 0) {
          std::fprintf(
              stderr,
              "rank %d: base %zu placement %d: output differs\n",
              r,
              base,
              static_cast<int>(p));
          return 11;
        }
        const bool all = total > 0 && all_in_arenas(p);
        if (t->zero_copy_allgathers() != before + (all ? 1 : 0))
          return 14;
      }
    }
    t->barrier();
    return a.in_use() == 0 ? 0 : 13;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
  EXPECT_TRUE(entries(job.shm_dir).empty());
}

INSTANTIATE_TEST_SUITE_P(
    ShmArena,
    ZeroCopy,
    ::testing::Values(2, 3),
    [](const ::testing::TestParamInfo<int>& info) {
      return std::to_string(info.param) + "Ranks";
    });

}  // namespace
