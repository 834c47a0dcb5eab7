// The shared-memory all-reduces (shm_transport.h): the step-by-step one,
// whole or split, with buffers read where they lie in the arenas
// (shm_arena.h), and the one that rides in the call check's frame step.
// docs/shared_memory.md, "Steps" and "Zero-copy buckets".
#include "comm/shm/shm_transport.h"

#include "comm/shm/reduce_n.h"
#include "comm/shm/shm_arena.h"
#include "comm/shm/shm_segment.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>

namespace ronde::detail::shm {
namespace {

// Range of a step's elements that rank r reduces in a split all-reduce:
// equal slices rounded to whole cache lines.
std::pair<size_t, size_t> slice_of(int r, int n, size_t m, size_t esz) {
  const size_t line = std::max<size_t>(1, kLine / esz);
  size_t per = (m + n - 1) / n;
  per = (per + line - 1) / line * line;
  const size_t lo = std::min(m, per * r);
  return {lo, std::min(m, lo + per)};
}

// dst[i] = src[i] * scale in the element type, as at::mul_ with a scalar
// computes it; dst may be src. Only for Transport::can_scale() types.
void scale_copy(
    void* dst, const void* src, size_t count, DType dtype, double scale) {
  if (dtype == DType::F32) {
    const float f = static_cast<float>(scale);
    auto* d = static_cast<float*>(dst);
    const auto* x = static_cast<const float*>(src);
    for (size_t i = 0; i < count; ++i)
      d[i] = x[i] * f;
  } else {
    auto* d = static_cast<double*>(dst);
    const auto* x = static_cast<const double*>(src);
    for (size_t i = 0; i < count; ++i)
      d[i] = x[i] * scale;
  }
}

// The piece of its slice that a rank reduces from every rank's arena buffer
// and writes back to every one before the next: within the first-level
// cache, so that the writes read nothing back. At 2 ranks, from 256 KiB to
// 64 MiB, 64 KiB pieces took 0.80x to 0.96x the time of 512 KiB ones,
// 16 KiB 0.75x to 0.92x that of 64 KiB, 8 KiB 0.86x to 0.97x that of
// 16 KiB (benchmarks/README.md, "Zero-copy buckets written in place").
constexpr size_t kZeroCopyPieceBytes = size_t{8} << 10;

// Where an all-reduce's input starts beside a frame: the next cache line.
size_t after_frame(size_t frame_bytes) {
  return (frame_bytes + kLine - 1) / kLine * kLine;
}

}  // namespace

void Transport::allreduce(
    void* buf, size_t count, DType dtype, Reduction op, double scale) {
  const ReduceNFn reduce = pick_reduce_n(dtype, op);
  const size_t esz = dtype_size(dtype);
  if (reduce == nullptr || esz == 0)
    throw std::invalid_argument("ronde: shared memory cannot reduce this type");
  if (scale != 1.0 && !can_scale(dtype))
    throw std::invalid_argument("ronde: shared memory cannot scale this type");
  const bool scaled = scale != 1.0;
  const bool split = count * esz >= split_bytes_;
  const size_t per_step = chunk_ / esz;
  auto* data = static_cast<char*>(buf);
  // An all-reduce of zero-copy size (the same on every rank) says in each
  // step where its input lies in this rank's arena, if it does there: then
  // it posts no copy, and the peers read it where it lies. Smaller ones
  // neither claim nor read claims.
  const bool claiming = zero_copy_size(count * esz);
  const std::optional<size_t> in_arena = arena_claim(data, count * esz);
  Control& me = control(rank_);
  for (size_t off = 0; off < count; off += per_step) {
    const size_t m = std::min(per_step, count - off);
    char* dst = data + off * esz;
    const uint64_t g = begin_step();
    const int s = static_cast<int>(g & 1);
    if (claiming) {
      me.claims[s].store(
          in_arena ? *in_arena + off * esz : kNoClaim,
          std::memory_order_relaxed);
    }
    if (!in_arena)
      std::memcpy(area(rank_, s, false), dst, m * esz);
    publish(kPosted, g);
    await_all(kPosted, g);
    // Every rank reads the same claims (all_claimed() loads them into
    // claims_): all decide alike.
    const bool all = claiming && all_claimed(s);
    const bool any =
        claiming && std::any_of(claims_.begin(), claims_.end(), [](uint64_t c) {
          return c != kNoClaim;
        });
    if (all && off == 0) {
      allreduce_in_arenas(count, esz, reduce, scale, dtype, g);
      return;
    }
    // A rank whose input is read in place must not write its result there
    // before the peers are done with it: with any claim the step splits,
    // which writes results only after every rank reduced its slice.
    if (!split && !any) {
      for (int r = 0; r < size_; ++r)
        inputs_[r] = area(r, s, false);
      inputs_[rank_] = own_input(dst, m * esz);
      reduce(dst, inputs_.data(), size_, m);
      publish(kConsumed, g);
      if (scaled)
        scale_copy(dst, dst, m, dtype, scale);
      continue;
    }
    const auto [lo, hi] = slice_of(rank_, size_, m, esz);
    for (int r = 0; r < size_; ++r) {
      const char* in = !any || claims_[r] == kNoClaim ? area(r, s, false)
                                                      : arenas_[r] + claims_[r];
      // Never this rank's own input area (own_input()).
      inputs_[r] = r == rank_ ? dst + lo * esz : in + lo * esz;
    }
    char* out = area(rank_, s, true) + lo * esz;
    reduce(out, inputs_.data(), size_, hi - lo);
    // Scaled once, by the rank that reduced the slice, while it is cached.
    if (scaled)
      scale_copy(out, out, hi - lo, dtype, scale);
    publish(kReduced, g);
    // Its own slice while it is cached, before the peers read it away.
    std::memcpy(dst + lo * esz, out, (hi - lo) * esz);
    await_all(kReduced, g);
    for (int i = 1; i < size_; ++i) {
      const int r = (rank_ + i) % size_;
      const auto [a, b] = slice_of(r, size_, m, esz);
      std::memcpy(dst + a * esz, area(r, s, true) + a * esz, (b - a) * esz);
    }
    publish(kConsumed, g);
  }
}

void Transport::allreduce_in_arenas(
    size_t count,
    size_t esz,
    void (*reduce)(void*, const void* const*, int, size_t),
    double scale,
    DType dtype,
    uint64_t g) {
  // This rank's slice of the whole buffer, from every rank's buffer in rank
  // order, through this slot's output area (a reduction never writes into
  // one of its own inputs), into every rank's buffer. No other rank reads
  // or writes that slice of any buffer, so no rank waits for another until
  // the end: then every buffer holds every slice. Each rank reads and
  // writes the buffer's size once, where a copying all-reduce also copies
  // its input in and reads its own input again.
  ++zero_copy_allreduces_;
  const int s = static_cast<int>(g & 1);
  char* scratch = area(rank_, s, true);
  const size_t piece = std::min(chunk_, kZeroCopyPieceBytes) / esz;
  const auto [lo, hi] = slice_of(rank_, size_, count, esz);
  for (size_t at = lo; at < hi; at += piece) {
    const size_t m = std::min(piece, hi - at);
    for (int r = 0; r < size_; ++r)
      inputs_[r] = arenas_[r] + claims_[r] + at * esz;
    reduce(scratch, inputs_.data(), size_, m);
    if (scale != 1.0)
      scale_copy(scratch, scratch, m, dtype, scale);
    // Each rank starts with the next rank's buffer: the ranks' writes
    // spread over the buffers.
    for (int i = 1; i <= size_; ++i) {
      const int r = (rank_ + i) % size_;
      std::memcpy(arenas_[r] + claims_[r] + at * esz, scratch, m * esz);
    }
  }
  // Once every rank has published `reduced`, every write into this rank's
  // buffer is done (release, then acquire): the buffer is the caller's
  // again.
  publish(kReduced, g);
  await_all(kReduced, g);
  publish(kConsumed, g);
}

std::optional<size_t> Transport::arena_claim(
    const void* data, size_t bytes) const {
  if (!zero_copy_fits(bytes))
    return std::nullopt;
  return arena_->offset_of(data, bytes);
}

const void* Transport::own_input(const void* data, size_t bytes) {
  if (rank_ < 2 && size_ > 1)
    return data;
  own_.resize(std::max(own_.size(), bytes));
  if (bytes > 0)  // an empty tensor's data may be null
    std::memcpy(own_.data(), data, bytes);
  return own_.data();
}

size_t Transport::fused_capacity(size_t frame_bytes) const {
  const size_t at = after_frame(frame_bytes);
  const size_t room = std::min(chunk_, ShmTuning::kMaxFusedBytes);
  return room > at ? room - at : 0;
}

bool Transport::exchange_frames(
    const void* frame,
    size_t frame_bytes,
    void* frames,
    void* data,
    size_t count,
    DType dtype,
    Reduction op,
    const std::function<bool(const void* frames)>& reduce_now) {
  const size_t at = after_frame(frame_bytes);
  const size_t esz = dtype_size(dtype);
  const ReduceNFn reduce = pick_reduce_n(dtype, op);
  if (reduce == nullptr || esz == 0 || at >= chunk_ ||
      count * esz > fused_capacity(frame_bytes))
    throw std::invalid_argument(
        "ronde: shared memory cannot carry this all-reduce with the frames");
  const uint64_t g = begin_step();
  const int s = static_cast<int>(g & 1);
  char* mine = area(rank_, s, false);
  std::memcpy(mine, frame, frame_bytes);
  if (count > 0)  // an empty tensor's data may be null
    std::memcpy(mine + at, data, count * esz);
  publish(kPosted, g);
  await_all(kPosted, g);
  auto* all = static_cast<char*>(frames);
  for (int r = 0; r < size_; ++r) {
    const void* from = r == rank_ ? frame : area(r, s, false);
    std::memcpy(all + r * frame_bytes, from, frame_bytes);
  }
  // The same frames on every rank: every rank reduces, or none does.
  const bool reduced = reduce_now(frames);
  if (reduced) {
    for (int r = 0; r < size_; ++r)
      inputs_[r] = area(r, s, false) + at;
    inputs_[rank_] = own_input(data, count * esz);
    reduce(data, inputs_.data(), size_, count);
  }
  publish(kConsumed, g);
  return reduced;
}

}  // namespace ronde::detail::shm
