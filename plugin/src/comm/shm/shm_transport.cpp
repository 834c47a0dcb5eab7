// The shared-memory transport: the step protocol, waiting, and the
// collectives built on steps, over the segments of shm_segment.h.
// A collective is the same sequence of steps on every rank; step g uses
// slot g mod 2. In a step a rank copies its piece into its input area and
// publishes `posted`; readers then reduce or copy from every rank's area
// (a split all-reduce first publishes `reduced` for its slice of the output
// area) and publish `consumed`. A rank reuses a slot only once every peer
// consumed it two steps earlier. Counters are release/acquire atomics; a
// wait spins, then sleeps on the peer's futex word and looks for a dead
// peer, an interrupt and the timeout.
// The all-reduces are in shm_allreduce.cpp.
// See docs/shared_memory.md, "Steps" and "Waiting".
#include "comm/shm/shm_transport.h"

#include "comm/shm/reduce_n.h"
#include "comm/shm/shm_arena.h"
#include "comm/shm/shm_segment.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ronde::detail::shm {

namespace {

// Every rank posts its outcome of a phase under `key`; all read all. The
// first failing rank's message, or empty when every rank succeeded.
std::string agree(
    const Rendezvous& rv,
    const std::string& key,
    int rank,
    int size,
    const std::string& mine) {
  rv.set(key + std::to_string(rank), mine.empty() ? "ok" : "error " + mine);
  std::string first;
  for (int r = 0; r < size; ++r) {
    std::string v = rv.get(key + std::to_string(r));
    if (v != "ok" && first.empty())
      first = "rank " + std::to_string(r) + ": " + v.substr(v.find(' ') + 1);
  }
  return first;
}

long futex(
    std::atomic<uint32_t>* word,
    int op,
    uint32_t val,
    const timespec* timeout) {
  return ::syscall(
      SYS_futex,
      reinterpret_cast<uint32_t*>(word),
      op,
      val,
      timeout,
      nullptr,
      0);
}

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

size_t clamp_piece(size_t total, size_t lo, size_t cap) {
  return total > lo ? std::min(cap, total - lo) : 0;
}

}  // namespace

std::unique_ptr<Transport> Transport::connect(
    const Options& options, const Rendezvous& rv) {
  Options o = options;
  // The smallest chunk a job may ask for is checked with the settings.
  // This rounding guards memory: reduce-scatter and all-to-all give each
  // rank a sub-area of a chunk, at least four cache lines each, whatever
  // the rank count, and a step never moves zero elements.
  o.chunk_bytes = std::max(o.chunk_bytes, 4 * kLine * o.size) / kLine * kLine;
  // Whole huge pages, so that the file's size and the arena's mapping are
  // page multiples whatever was asked.
  o.arena_bytes = o.arena_bytes / (size_t{2} << 20) * (size_t{2} << 20);
  // Once per process, before its own segments exist: closing a descriptor
  // of a file drops this process's lock on it, so the sweep must never
  // open a segment this process owns.
  static std::once_flag swept;
  std::call_once(swept, [&] { remove_stale_segments(o.dir); });

  std::string nonce;
  if (o.rank == 0) {
    nonce = random_nonce();
    rv.set("nonce", nonce);
  } else {
    nonce = rv.get("nonce");
  }
  std::vector<Segment> segs(static_cast<size_t>(o.size));
  std::shared_ptr<Arena> arena;
  std::string made = create_segment(o, nonce, segs[o.rank]);
  if (made.empty() && o.arena_bytes > 0) {
    try {
      arena = std::make_shared<Arena>(
          segs[o.rank].fd, arena_offset(o.chunk_bytes), o.arena_bytes);
    } catch (const std::exception& e) {
      made = std::string(e.what()) + " (RONDE_SHM_ARENA_BYTES)";
    }
  }
  std::string problem = agree(rv, "made/", o.rank, o.size, made);
  if (!problem.empty())
    throw Unavailable(problem);
  std::string mine;
  for (int p = 0; p < o.size && mine.empty(); ++p) {
    if (p != o.rank)
      mine = open_segment(o, nonce, p, segs[p]);
  }
  problem = agree(rv, "mapped/", o.rank, o.size, mine);
  if (!problem.empty())
    throw Unavailable(problem);
  // Every rank mapped every segment: the names have served, and from here
  // on nothing of this job is left in the directory, however it ends.
  ::unlink(segs[o.rank].path.c_str());
  segs[o.rank].path.clear();
  return std::unique_ptr<Transport>(
      new Transport(o, std::move(segs), std::move(arena)));
}

Transport::Transport(
    const Options& o,
    std::vector<Segment> segments,
    std::shared_ptr<Arena> arena)
    : rank_(o.rank),
      size_(o.size),
      chunk_(o.chunk_bytes),
      split_bytes_(o.split_bytes_for(o.size)),
      zero_copy_min_bytes_(o.zero_copy_min_bytes),
      timeout_(o.timeout),
      spin_(o.spin),
      segments_(std::move(segments)),
      arena_(std::move(arena)),
      arenas_(static_cast<size_t>(o.size)),
      claims_(static_cast<size_t>(o.size)),
      seen_(static_cast<size_t>(o.size) * kCounters),
      inputs_(static_cast<size_t>(o.size)) {
  for (int r = 0; r < size_; ++r) {
    arenas_[r] = r == rank_ ? (arena_ ? arena_->base() : nullptr)
                            : static_cast<char*>(segments_[r].arena);
  }
  // More ranks than CPUs: a spinning rank holds the CPU its peer needs.
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  yield_while_spinning_ = cpus > 0 && o.size > cpus;
}

Transport::~Transport() {
  Control& me = control(rank_);
  uint32_t expected = kLive;
  me.state.compare_exchange_strong(expected, kClosed);
  me.wake.fetch_add(1);
  futex(&me.wake, FUTEX_WAKE, INT_MAX, nullptr);
}

Control& Transport::control(int r) const {
  return *static_cast<Control*>(segments_[r].base);
}

char* Transport::area(int r, int slot, bool out) const {
  return static_cast<char*>(segments_[r].base) + kControlBytes +
         (static_cast<size_t>(slot) * 2 + (out ? 1 : 0)) * chunk_;
}

void Transport::interrupt() {
  interrupted_.store(true);
  Control& me = control(rank_);
  uint32_t expected = kLive;
  me.state.compare_exchange_strong(expected, kAborted);
  me.wake.fetch_add(1);
  futex(&me.wake, FUTEX_WAKE, INT_MAX, nullptr);
}

void Transport::fail(
    Failure::Kind kind, int peer, const std::string& msg, bool exited) {
  broken_ = msg;
  interrupt();  // peers waiting on this rank fail now, not at their timeout
  throw Failure(kind, peer, msg, exited);
}

void Transport::check_usable() const {
  if (!broken_.empty())
    throw Failure(
        Failure::Kind::Broken,
        -1,
        "the shared-memory communicator is unusable after an earlier "
        "failure: " +
            broken_);
  if (interrupted_.load())
    throw Failure(
        Failure::Kind::Interrupted,
        -1,
        "the shared-memory communicator was interrupted");
}

bool Transport::peer_alive(int peer) const {
  return owner_lock_held(segments_[peer].fd);
}

uint64_t Transport::begin_step() {
  check_usable();
  const uint64_t g = ++step_;
  control(rank_).cpu.store(::sched_getcpu(), std::memory_order_relaxed);
  // The slot this step writes was read by every peer in step g - 2. A peer
  // publishes its counters in step order, so one seen at step g - 1 says
  // that it consumed step g - 2 already: most steps load no peer's line.
  if (g > 2) {
    for (int i = 1; i < size_; ++i) {
      const int peer = (rank_ + i) % size_;
      const uint64_t* seen = &seen_[static_cast<size_t>(peer) * kCounters];
      if (seen[kPosted] < g - 1 && seen[kReduced] < g - 1)
        await(peer, kConsumed, g - 2);
    }
  }
  return g;
}

void Transport::publish(int counter, uint64_t step) {
  Control& me = control(rank_);
  me.counters[counter].value.store(step, std::memory_order_seq_cst);
  // Pairs with the waiter's sleepers increment (both sequentially
  // consistent): either it sees the new value, or this sees it waiting.
  if (me.sleepers.load(std::memory_order_seq_cst) != 0) {
    me.wake.fetch_add(1, std::memory_order_seq_cst);
    futex(&me.wake, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void Transport::await(int peer, int counter, uint64_t step) {
  uint64_t& seen = seen_[static_cast<size_t>(peer) * kCounters + counter];
  if (seen >= step)
    return;
  Control& p = control(peer);
  std::atomic<uint64_t>& value = p.counters[counter].value;
  if ((seen = value.load(std::memory_order_acquire)) >= step)
    return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const int here = ::sched_getcpu();
  // Spin: a peer that is about to arrive costs no sleep and wake-up. A
  // peer that last ran on this CPU cannot arrive while this rank holds it
  // (two ranks the scheduler put on one core, or more ranks than cores):
  // spinning there only burns the budget, each side in turn, at every
  // step; yielding hands the CPU over at once.
  for (uint32_t i = 1;; ++i) {
    cpu_relax();
    if ((seen = value.load(std::memory_order_acquire)) >= step)
      return;
    if ((i & 63) == 0) {
      if (yield_while_spinning_ ||
          p.cpu.load(std::memory_order_relaxed) == here)
        std::this_thread::yield();
      if (Clock::now() - start >= spin_)
        break;
    }
  }
  // Sleep on the peer's futex word, waking at least every 20 ms to look
  // for a dead peer, an interrupt and the timeout.
  p.sleepers.fetch_add(1, std::memory_order_seq_cst);
  struct Leave {
    std::atomic<uint32_t>& s;
    ~Leave() {
      s.fetch_sub(1, std::memory_order_seq_cst);
    }
  } leave{p.sleepers};
  auto next_check = start;
  for (;;) {
    const uint32_t w = p.wake.load(std::memory_order_seq_cst);
    if ((seen = value.load(std::memory_order_seq_cst)) >= step)
      return;
    const uint32_t state = p.state.load(std::memory_order_acquire);
    // Only a failing wait needs the text.
    auto who = [&] {
      return "rank " + std::to_string(peer) + " (pid " + std::to_string(p.pid) +
             ")";
    };
    if (state == kAborted)
      fail(
          Failure::Kind::PeerGone,
          peer,
          who() + " gave up its shared-memory communicator after a failure");
    if (state == kClosed)
      fail(
          Failure::Kind::PeerGone,
          peer,
          who() + " left the job (shut down) while this rank waited for it");
    if (interrupted_.load())
      fail(
          Failure::Kind::Interrupted,
          -1,
          "interrupted while waiting for " + who());
    const auto now = Clock::now();
    if (now >= next_check) {
      if (!peer_alive(peer))
        fail(
            Failure::Kind::PeerGone,
            peer,
            who() + " exited while this rank waited for it",
            /*exited=*/true);
      next_check = now + std::chrono::milliseconds(100);
    }
    if (now - start >= timeout_)
      fail(
          Failure::Kind::Timeout,
          peer,
          "timed out after " + std::to_string(timeout_.count()) +
              " ms waiting for " + who());
    timespec ts{0, 20 * 1000 * 1000};
    futex(&p.wake, FUTEX_WAIT, w, &ts);
  }
}

void Transport::await_all(int counter, uint64_t step) {
  for (int i = 1; i < size_; ++i)
    await((rank_ + i) % size_, counter, step);
}

void Transport::broadcast(void* buf, size_t bytes, int root) {
  auto* data = static_cast<char*>(buf);
  for (size_t off = 0; off < bytes; off += chunk_) {
    const size_t m = std::min(chunk_, bytes - off);
    const uint64_t g = begin_step();
    const int s = static_cast<int>(g & 1);
    if (rank_ == root) {
      std::memcpy(area(rank_, s, false), data + off, m);
      publish(kPosted, g);
    } else {
      await(root, kPosted, g);
      std::memcpy(data + off, area(root, s, false), m);
    }
    publish(kConsumed, g);
  }
}

void Transport::allgatherv(const void* in, void* out, const size_t* bytes) {
  std::vector<size_t> offset(static_cast<size_t>(size_));
  size_t most = 0;
  for (int r = 0; r < size_; ++r) {
    offset[r] = r == 0 ? 0 : offset[r - 1] + bytes[r - 1];
    most = std::max(most, bytes[r]);
  }
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  // One of zero-copy size says in its first step where its output lies in
  // this rank's arena, if it does. When every rank's does, each rank writes
  // its block into every rank's output and the call ends there; else the
  // steps go on through the input areas, the first one's already posted.
  const size_t total = offset[size_ - 1] + bytes[size_ - 1];
  const bool claiming = zero_copy_size(total);
  Control& me = control(rank_);
  for (size_t lo = 0; lo < most; lo += chunk_) {
    const uint64_t g = begin_step();
    const int s = static_cast<int>(g & 1);
    const size_t mine = clamp_piece(bytes[rank_], lo, chunk_);
    if (mine > 0)
      std::memcpy(area(rank_, s, false), src + lo, mine);
    if (claiming && lo == 0) {
      me.claims[s].store(
          arena_claim(out, total).value_or(kNoClaim),
          std::memory_order_relaxed);
    }
    publish(kPosted, g);
    await_all(kPosted, g);
    if (claiming && lo == 0 && all_claimed(s)) {
      allgather_into_arenas(src, bytes[rank_], offset[rank_], g);
      return;
    }
    for (int r = 0; r < size_; ++r) {
      const size_t len = clamp_piece(bytes[r], lo, chunk_);
      if (len > 0) {
        std::memcpy(
            dst + offset[r] + lo,
            r == rank_ ? src + lo : area(r, s, false),
            len);
      }
    }
    publish(kConsumed, g);
  }
}

bool Transport::all_claimed(int slot) {
  bool all = true;
  for (int r = 0; r < size_; ++r) {
    claims_[r] = control(r).claims[slot].load(std::memory_order_relaxed);
    all = all && claims_[r] != kNoClaim;
  }
  return all;
}

void Transport::allgather_into_arenas(
    const char* src, size_t bytes, size_t at, uint64_t g) {
  // This rank's block into every rank's output (claims_), starting with
  // the next rank's, so that the ranks' writes spread over the buffers.
  // No other rank writes those bytes; once every rank has published
  // `reduced`, every block is in every output (release, then acquire).
  ++zero_copy_allgathers_;
  for (int i = 1; i <= size_; ++i) {
    const int r = (rank_ + i) % size_;
    char* to = arenas_[r] + claims_[r] + at;
    if (bytes > 0 && to != src)
      std::memcpy(to, src, bytes);
  }
  publish(kReduced, g);
  await_all(kReduced, g);
  publish(kConsumed, g);
}

void Transport::reduce_scatter(
    const void* in,
    void* out,
    const size_t* counts,
    DType dtype,
    Reduction op) {
  const ReduceNFn reduce = pick_reduce_n(dtype, op);
  const size_t esz = dtype_size(dtype);
  if (reduce == nullptr || esz == 0)
    throw std::invalid_argument("ronde: shared memory cannot reduce this type");
  // Each step carries one piece of every rank's block: a sub-area per rank.
  const size_t sub = chunk_ / size_ / kLine * kLine;
  const size_t per = sub / esz;
  std::vector<size_t> start(static_cast<size_t>(size_));
  size_t most = 0;
  for (int r = 0; r < size_; ++r) {
    start[r] = r == 0 ? 0 : start[r - 1] + counts[r - 1];
    most = std::max(most, counts[r]);
  }
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  // As the all-reduce: one of zero-copy size says in each step where its
  // input lies in this rank's arena, if it does, and posts no copy of it;
  // the peers read their blocks there.
  const size_t total = start[size_ - 1] + counts[size_ - 1];
  const bool claiming = zero_copy_size(total * esz);
  const std::optional<size_t> in_arena = arena_claim(in, total * esz);
  Control& me = control(rank_);
  uint64_t g = 0;
  for (size_t lo = 0; lo < most; lo += per) {
    g = begin_step();
    const int s = static_cast<int>(g & 1);
    char* mine = area(rank_, s, false);
    if (claiming) {
      me.claims[s].store(
          in_arena.value_or(kNoClaim), std::memory_order_relaxed);
    }
    for (int r = 0; r < size_ && !in_arena; ++r) {
      const size_t len = clamp_piece(counts[r], lo, per);
      if (len > 0)
        std::memcpy(mine + r * sub, src + (start[r] + lo) * esz, len * esz);
    }
    publish(kPosted, g);
    await_all(kPosted, g);
    // Every rank reads the same claims: all decide alike. Every rank's
    // input in its arena (known in the first step): this rank's whole
    // block in this one step, read where each input lies.
    const bool whole = claiming && all_claimed(s);
    const size_t len =
        whole ? counts[rank_] : clamp_piece(counts[rank_], lo, per);
    for (int r = 0; r < size_; ++r) {
      inputs_[r] = claiming && claims_[r] != kNoClaim
                       ? arenas_[r] + claims_[r] + (start[rank_] + lo) * esz
                       : area(r, s, false) + rank_ * sub;
    }
    reduce(dst + lo * esz, inputs_.data(), size_, len);
    publish(kConsumed, g);
    if (whole) {
      ++zero_copy_reduce_scatters_;
      break;
    }
  }
  // Peers read this rank's input where it lies until they have consumed
  // the last step: only then is it the caller's again.
  if (in_arena && claiming && g > 0)
    await_all(kConsumed, g);
}

void Transport::alltoallv(
    const void* in,
    const int64_t* send_bytes,
    void* out,
    const int64_t* recv_bytes) {
  const size_t sub = chunk_ / size_ / kLine * kLine;
  std::vector<size_t> soff(static_cast<size_t>(size_)),
      roff(static_cast<size_t>(size_));
  uint64_t steps = 0;
  for (int r = 0; r < size_; ++r) {
    soff[r] = r == 0 ? 0 : soff[r - 1] + static_cast<size_t>(send_bytes[r - 1]);
    roff[r] = r == 0 ? 0 : roff[r - 1] + static_cast<size_t>(recv_bytes[r - 1]);
    const size_t most =
        static_cast<size_t>(std::max(send_bytes[r], recv_bytes[r]));
    if (r != rank_)
      steps = std::max<uint64_t>(steps, (most + sub - 1) / sub);
  }
  // A rank knows only its own pairs: the job's step count is the most any
  // rank needs.
  std::vector<uint64_t> all(static_cast<size_t>(size_));
  std::vector<size_t> eight(static_cast<size_t>(size_), sizeof(uint64_t));
  allgatherv(&steps, all.data(), eight.data());
  for (uint64_t v : all)
    steps = std::max(steps, v);
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  // An empty tensor's data may be null, which memcpy may not be given.
  if (send_bytes[rank_] > 0) {
    std::memcpy(
        dst + roff[rank_],
        src + soff[rank_],
        static_cast<size_t>(send_bytes[rank_]));
  }
  for (uint64_t k = 0; k < steps; ++k) {
    const size_t lo = k * sub;
    const uint64_t g = begin_step();
    const int s = static_cast<int>(g & 1);
    char* mine = area(rank_, s, false);
    for (int r = 0; r < size_; ++r) {
      const size_t len =
          clamp_piece(static_cast<size_t>(send_bytes[r]), lo, sub);
      if (r != rank_ && len > 0)
        std::memcpy(mine + r * sub, src + soff[r] + lo, len);
    }
    publish(kPosted, g);
    await_all(kPosted, g);
    for (int r = 0; r < size_; ++r) {
      const size_t len =
          clamp_piece(static_cast<size_t>(recv_bytes[r]), lo, sub);
      if (r != rank_ && len > 0)
        std::memcpy(dst + roff[r] + lo, area(r, s, false) + rank_ * sub, len);
    }
    publish(kConsumed, g);
  }
}

void Transport::barrier() {
  const uint64_t g = begin_step();
  publish(kPosted, g);
  await_all(kPosted, g);
  publish(kConsumed, g);
}

}  // namespace ronde::detail::shm
