// The shared-memory transport on its own: ranks are forked processes that
// meet through a directory instead of a store. What the collectives compute
// is tested through the public API (multirank/collectives_test.cpp); here:
// segment names and modes, what is left behind, dead and late peers, and
// a directory too small.
#include "comm/shm/shm_transport.h"
#include "comm/dtype_table.h"
#include "comm/shm/shm_arena.h"
#include "runtime/rendezvous.h"
#include "shm_job.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace shm = ronde::detail::shm;
using ronde::detail::DType;
using ronde::detail::Reduction;
using ronde::detail::ShmTuning;
using namespace ronde::testing::shm_job;

namespace {

double thread_cpu_seconds() {
  struct rusage u {};
  ::getrusage(RUSAGE_THREAD, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

TEST(ShmTransport, SegmentsArePrivateRandomAndGoneOnceConnected) {
  Job job;
  ASSERT_FALSE(job.shm_dir.empty());
  const int n = 3;
  job.start(n, [&](int r) {
    shm::Rendezvous rv = file_rendezvous(job.rv_dir);
    // Between "made" and "mapped" every name exists: rank 0 looks just
    // before it posts its own "mapped" record, which no rank can unlink its
    // segment without. (Looking after it, at its first read of "mapped",
    // raced with the others' unlink: a name listed, then gone for stat.)
    auto set = rv.set;
    rv.set = [&, set](const std::string& k, const std::string& v) {
      if (r == 0 && k == "mapped/0") {
        std::string seen;
        for (const auto& e : entries(job.shm_dir)) {
          struct stat st {};
          ::stat((job.shm_dir + "/" + e).c_str(), &st);
          char mode[8];
          std::snprintf(mode, sizeof(mode), "%o", st.st_mode & 0777);
          seen += e + " " + mode + "\n";
        }
        job.write("seen", seen);
      }
      set(k, v);
    };
    auto t = shm::Transport::connect(job.options(r, n), rv);
    t->barrier();
    if (r == 0)
      job.write("after", std::to_string(entries(job.shm_dir).size()));
    t->barrier();
    return 0;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
  const std::string seen = job.read("seen");
  std::istringstream lines(seen);
  std::string name, mode, nonce;
  int count = 0;
  while (lines >> name >> mode) {
    ++count;
    EXPECT_EQ(mode, "600") << seen;
    // ronde-<32 hex digits>-<rank>, the same random part for the job.
    ASSERT_EQ(name.rfind("ronde-", 0), 0u) << seen;
    std::string part = name.substr(6, 32);
    EXPECT_EQ(part.find_first_not_of("0123456789abcdef"), std::string::npos);
    if (nonce.empty())
      nonce = part;
    EXPECT_EQ(part, nonce) << seen;
  }
  EXPECT_EQ(count, n) << seen;
  EXPECT_EQ(job.read("after"), "0");
  EXPECT_TRUE(entries(job.shm_dir).empty());
}

TEST(ShmTransport, CollectivesAcrossChunks) {
  // A smoke test of every collective at sizes around the 4096-byte chunk
  // (the public API's tests cover types, ops and ragged shapes).
  Job job;
  const int n = 3;
  job.start(n, [&](int r) {
    auto t =
        shm::Transport::connect(job.options(r, n), file_rendezvous(job.rv_dir));
    // A second transport between the same ranks, splitting every
    // all-reduce: both algorithms must give the same bits.
    shm::Options o = job.options(r, n);
    o.split_bytes = 0;
    auto split = shm::Transport::connect(o, file_rendezvous(job.rv_dir, "s"));
    for (size_t count : {size_t{1}, size_t{1023}, size_t{1024}, size_t{5000}}) {
      auto val = [](int rank, size_t i) {
        return static_cast<float>(rank + 1) * 0.1f * static_cast<float>(i % 7);
      };
      std::vector<float> x(count), y(count);
      for (size_t i = 0; i < count; ++i)
        x[i] = y[i] = val(r, i);
      t->allreduce(x.data(), count, DType::F32, Reduction::Sum);
      split->allreduce(y.data(), count, DType::F32, Reduction::Sum);
      for (size_t i = 0; i < count; ++i) {
        // In rank order, on every rank and by both algorithms.
        const float want = (val(0, i) + val(1, i)) + val(2, i);
        if (x[i] != want || std::memcmp(&x[i], &y[i], 4) != 0)
          return 10;
      }
      std::vector<int32_t> b(count, r == 1 ? 42 : 0);
      t->broadcast(b.data(), count * 4, 1);
      for (int32_t v : b) {
        if (v != 42)
          return 11;
      }
      std::vector<size_t> bytes = {count, count + 3, 0};
      std::vector<char> in(bytes[r], static_cast<char>('a' + r));
      std::vector<char> out(bytes[0] + bytes[1] + bytes[2]);
      t->allgatherv(in.data(), out.data(), bytes.data());
      for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] != (i < bytes[0] ? 'a' : 'b'))
          return 12;
      }
      std::vector<size_t> counts = {count, count + 1, 2};
      std::vector<int64_t> rs(counts[0] + counts[1] + counts[2], r + 1);
      std::vector<int64_t> mine(counts[r]);
      t->reduce_scatter(
          rs.data(), mine.data(), counts.data(), DType::I64, Reduction::Sum);
      for (int64_t v : mine) {
        if (v != 6)
          return 13;
      }
    }
    t->barrier();
    return 0;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
}

// One collective of `op` over 16 MiB per rank (many chunks), by rank r of
// n.
// `arena`, when given: a buffer of count * n floats in the transport's
// arena, which is the all-reduce's buffer, the reduce-scatter's input or
// the all-gather's output, as the engine's buckets are (read or written
// in place).
void run_collective(
    shm::Transport& t,
    const std::string& op,
    int r,
    int n,
    float* arena = nullptr) {
  const size_t count = size_t{4} << 20;
  std::vector<float> x(count * n, 1.0f), y(count * n);
  float* in = x.data();
  float* out = y.data();
  if (arena != nullptr && op == "allgather") {
    out = arena;
  } else if (arena != nullptr) {
    std::fill(arena, arena + count * n, 1.0f);
    in = arena;
  }
  if (op == "allreduce") {
    t.allreduce(in, count, DType::F32, Reduction::Sum);
  } else if (op == "broadcast") {
    t.broadcast(x.data(), count * 4, n - 1);
  } else if (op == "allgather") {
    std::vector<size_t> bytes(n, count * 4);
    t.allgatherv(in, out, bytes.data());
  } else if (op == "reducescatter") {
    std::vector<size_t> counts(n, count);
    t.reduce_scatter(in, out, counts.data(), DType::F32, Reduction::Sum);
  } else if (op == "alltoall") {
    std::vector<int64_t> bytes(n, count * 4);
    t.alltoallv(x.data(), bytes.data(), y.data(), bytes.data());
  } else {
    t.barrier();
  }
  (void)r;
}

class KilledPeer : public ::testing::TestWithParam<std::string> {};

// The last rank dies (SIGKILL) a moment into the collective: the others
// fail within about the 100 ms between checks of its lock, not at the 20 s
// timeout, and every later call fails at once. "_arena": with every rank's
// buffer in its arena (the in-place paths).
TEST_P(KilledPeer, IsNamedQuicklyInEveryCollective) {
  Job job;
  const int n = 3;
  std::string op = GetParam();
  const bool arena = op.size() > 6 && op.substr(op.size() - 6) == "_arena";
  if (arena)
    op.resize(op.size() - 6);
  job.start(n, [&](int r) {
    shm::Options o = job.options(r, n);
    if (arena)
      o.arena_bytes = size_t{1} << 30;  // address space; pages as used
    auto t = shm::Transport::connect(o, file_rendezvous(job.rv_dir));
    float* buf = nullptr;
    if (arena) {
      // Left allocated: the process ends with the test.
      const size_t bytes = (size_t{4} << 20) * n * sizeof(float);
      const std::optional<size_t> at = t->arena()->allocate(bytes);
      if (!at)
        return 24;
      buf = reinterpret_cast<float*>(t->arena()->base() + *at);
      // One call before the death: it takes the in-place path.
      auto in_place = [&] {
        return t->zero_copy_allreduces() + t->zero_copy_reduce_scatters() +
               t->zero_copy_allgathers();
      };
      const uint64_t before = in_place();
      run_collective(*t, op, r, n, buf);
      if (in_place() != before + 1)
        return 25;
    }
    t->barrier();
    if (r == n - 1) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ::kill(::getpid(), SIGKILL);
      }).detach();
      if (op == "barrier")
        std::this_thread::sleep_for(std::chrono::seconds(10));
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 100; ++i)
        run_collective(*t, op, r, n, buf);
      return 20;
    } catch (const shm::Failure& e) {
      const double s = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count();
      job.write(
          "failure" + std::to_string(r),
          std::string(e.what()) + "\nseconds " + std::to_string(s) + "\n");
      try {
        t->barrier();
        return 21;
      } catch (const shm::Failure& later) {
        if (later.kind != shm::Failure::Kind::Broken)
          return 22;
      }
      return e.kind == shm::Failure::Kind::PeerGone ? 0 : 23;
    }
  });
  std::vector<int> codes = job.wait();
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
  std::string named;
  for (int r = 0; r < 2; ++r) {
    const std::string f = job.read("failure" + std::to_string(r));
    // The rank that saw the death names rank 2; the other may instead hear
    // that rank 0 or 1 gave up after that failure.
    EXPECT_NE(f.find("rank "), std::string::npos) << f;
    if (f.find("rank 2 ") != std::string::npos)
      named = f;
    ASSERT_NE(f.find("seconds "), std::string::npos) << f;
    const double seconds = std::stod(f.substr(f.find("seconds ") + 8));
    std::printf(
        "%s: rank %d failed after %.3f s: %s",
        op.c_str(),
        r,
        seconds,
        f.substr(0, f.find('\n') + 1).c_str());
    EXPECT_LT(seconds, 5.0) << f;
  }
  EXPECT_NE(named.find("exited"), std::string::npos) << named;
  EXPECT_TRUE(entries(job.shm_dir).empty());
}

INSTANTIATE_TEST_SUITE_P(
    ShmTransport,
    KilledPeer,
    ::testing::Values(
        "allreduce",
        "broadcast",
        "allgather",
        "reducescatter",
        "alltoall",
        "barrier",
        "allreduce_arena",
        "allgather_arena",
        "reducescatter_arena"));

// The all-reduce fused with the check's frames is held to kMaxFusedBytes
// whatever the chunk; a small chunk holds it to the rest of the chunk.
TEST(ShmTransport, FusedStepIsHeldToItsLimit) {
  Job job;
  const int n = 2;
  job.start(n, [&](int r) {
    shm::Options o = job.options(r, n);
    o.chunk_bytes = size_t{1} << 20;
    auto big = shm::Transport::connect(o, file_rendezvous(job.rv_dir));
    auto small = shm::Transport::connect(
        job.options(r, n), file_rendezvous(job.rv_dir, "s"));
    const size_t frame = 40;  // rounded up to one cache line
    if (big->fused_capacity(frame) != ShmTuning::kMaxFusedBytes - 64)
      return 1;
    if (small->fused_capacity(frame) != 4096 - 64)
      return 2;
    return 0;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
}

TEST(ShmTransport, WaitingForALatePeerSleeps) {
  Job job;
  job.start(2, [&](int r) {
    auto t =
        shm::Transport::connect(job.options(r, 2), file_rendezvous(job.rv_dir));
    t->barrier();
    if (r == 1)
      std::this_thread::sleep_for(std::chrono::seconds(2));
    const double cpu = thread_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    t->barrier();
    if (r == 0) {
      const double wall = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count();
      job.write(
          "cpu",
          std::to_string(thread_cpu_seconds() - cpu) + " " +
              std::to_string(wall));
    }
    return 0;
  });
  EXPECT_EQ(job.wait(), std::vector<int>(2, 0));
  std::istringstream in(job.read("cpu"));
  double cpu = 0, wall = 0;
  in >> cpu >> wall;
  std::printf("waiting %.2f s for a late peer cost %.4f s of CPU\n", wall, cpu);
  EXPECT_GT(wall, 1.5);
  // A spinning wait would cost about the 2 s it waited.
  EXPECT_LT(cpu, 0.2);
}

TEST(ShmTransport, InterruptFailsPeersAtOnce) {
  Job job;
  job.start(2, [&](int r) {
    auto t =
        shm::Transport::connect(job.options(r, 2), file_rendezvous(job.rv_dir));
    t->barrier();
    if (r == 1) {
      t->interrupt();
      return 0;
    }
    try {
      t->barrier();
      return 30;
    } catch (const shm::Failure& e) {
      return e.kind == shm::Failure::Kind::PeerGone && e.peer == 1 ? 0 : 31;
    }
  });
  EXPECT_EQ(job.wait(), std::vector<int>(2, 0));
}

TEST(ShmTransport, AbsentPeerTimesOut) {
  Job job;
  job.start(2, [&](int r) {
    shm::Options o = job.options(r, 2);
    o.timeout = std::chrono::milliseconds(300);
    auto t = shm::Transport::connect(o, file_rendezvous(job.rv_dir));
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return 0;
    }
    try {
      t->barrier();
      return 40;
    } catch (const shm::Failure& e) {
      return e.kind == shm::Failure::Kind::Timeout ? 0 : 41;
    }
  });
  EXPECT_EQ(job.wait(), std::vector<int>(2, 0));
}

TEST(ShmTransport, StaleSegmentsOfDeadOwnersAreRemoved) {
  const std::string dir = make_dir("/dev/shm");
  ASSERT_FALSE(dir.empty());
  // Left by a job killed during init: no process holds its lock.
  { std::ofstream(dir + "/ronde-00ff-1") << "x"; }
  // One whose owner lives (a child holding the lock).
  { std::ofstream(dir + "/ronde-00ff-0") << "x"; }
  { std::ofstream(dir + "/other-file") << "x"; }
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t owner = ::fork();
  if (owner == 0) {
    int fd = ::open((dir + "/ronde-00ff-0").c_str(), O_RDWR);
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    l.l_len = 1;
    ::fcntl(fd, F_SETLK, &l);
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_EQ(shm::remove_stale_segments(dir), 1);
  auto left = entries(dir);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"other-file", "ronde-00ff-0"}));
  ::kill(owner, SIGKILL);
  ::waitpid(owner, nullptr, 0);
  EXPECT_EQ(shm::remove_stale_segments(dir), 1);
  EXPECT_EQ(entries(dir), std::vector<std::string>{"other-file"});
  ::close(ready[0]);
  ::close(ready[1]);
  remove_tree(dir);
}

// Every rank gets the same Unavailable, and nothing is left behind.
void expect_unavailable_everywhere(
    Job& job, const std::string& dir, const std::string& needle) {
  const int n = 2;
  job.start(n, [&](int r) {
    shm::Options o = job.options(r, n);
    o.dir = dir;
    o.chunk_bytes = 1 << 20;
    try {
      shm::Transport::connect(o, file_rendezvous(job.rv_dir));
      return 50;
    } catch (const shm::Unavailable& e) {
      job.write("why" + std::to_string(r), e.what());
      return 0;
    }
  });
  EXPECT_EQ(job.wait(), std::vector<int>(n, 0));
  EXPECT_EQ(job.read("why0"), job.read("why1"));
  EXPECT_NE(job.read("why0").find(needle), std::string::npos)
      << job.read("why0");
}

TEST(ShmTransport, MissingDirectoryIsUnavailable) {
  Job job;
  expect_unavailable_everywhere(job, job.shm_dir + "/absent", "cannot create");
}

TEST(ShmTransport, TooSmallDirectoryIsUnavailableWithTheSizeNeeded) {
  Job job;
  const std::string small = make_dir("/tmp");
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=1m,mode=0700") != 0) {
    ::rmdir(small.c_str());
    GTEST_SKIP() << "cannot mount a small tmpfs (needs root)";
  }
  // Two ranks of 4.0 MiB each in 1 MiB.
  expect_unavailable_everywhere(job, small, "cannot reserve 4.0 MiB per rank");
  EXPECT_TRUE(entries(small).empty());
  ::umount(small.c_str());
  ::rmdir(small.c_str());
}

TEST(HostIdentity, OtherNetworkNamespaceIsAnotherHost) {
  const std::string here = ronde::detail::host_identity();
  EXPECT_NE(here.find("/net:"), std::string::npos) << here;
  EXPECT_EQ(ronde::detail::host_identity(), here);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t p = ::fork();
  if (p == 0) {
    std::string there =
        ::unshare(CLONE_NEWNET) == 0 ? ronde::detail::host_identity() : "skip";
    (void)!::write(fds[1], there.data(), there.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  char buf[512] = {0};
  ssize_t got = ::read(fds[0], buf, sizeof(buf) - 1);
  ::close(fds[0]);
  ::waitpid(p, nullptr, 0);
  std::string there(buf, got > 0 ? got : 0);
  if (there == "skip")
    GTEST_SKIP() << "cannot make a network namespace (needs root)";
  EXPECT_NE(there, here);
  // The same machine: the boot id part agrees.
  EXPECT_EQ(there.substr(0, there.find('/')), here.substr(0, here.find('/')));
}

}  // namespace
