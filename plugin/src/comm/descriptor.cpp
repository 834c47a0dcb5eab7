// Descriptors and frames: making one, comparing them, the message of a
// mismatch, and the codec of the check's fixed-size frame.
#include "comm/descriptor.h"

#include <ronde/collectives.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstring>
#include <map>
#include <sstream>

namespace ronde {

// Here rather than with the collectives: the descriptor's text needs it,
// and this file is fuzzed without the rest (tests/fuzz).
const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Average:
      return "average";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Product:
      return "product";
  }
  return "unknown";
}

}  // namespace ronde

namespace ronde::detail {
namespace {

void copy_text(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

std::string shape_text(const Descriptor& d, bool skip_dim0) {
  if (d.ndim < 0)
    return "<undefined>";
  std::ostringstream os;
  os << c10::toString(static_cast<at::ScalarType>(d.dtype)) << "[";
  for (int i = 0; i < d.ndim; ++i) {
    os << (i ? ", " : "");
    if (i == 0 && skip_dim0) {
      os << "*";
    } else {
      os << d.dims[i];
    }
  }
  os << "]";
  return os.str();
}

// The element size of a dtype from a descriptor; 0 for one no tensor has
// (c10 throws for those).
int64_t element_bytes(int32_t dtype) {
  try {
    return static_cast<int64_t>(
        c10::elementSize(static_cast<c10::ScalarType>(dtype)));
  } catch (const c10::Error&) {
    return 0;
  }
}

// Why a descriptor from a peer cannot be read (nullptr when it can): its
// fields index tables and arrays, so each is checked before any is used.
const char* malformed(const Descriptor& d) {
  if (d.magic != kDescriptorMagic)
    return "bad magic number";
  if (d.kind < static_cast<int32_t>(OpKind::Allreduce) ||
      d.kind > static_cast<int32_t>(OpKind::Join))
    return "unknown collective";
  if (d.dtype < -1 ||
      d.dtype >= static_cast<int32_t>(c10::ScalarType::NumOptions) ||
      (d.dtype >= 0 && element_bytes(d.dtype) == 0))
    return "unknown dtype";
  if (d.op < -1 || d.op > static_cast<int32_t>(ReduceOp::Product))
    return "unknown reduction";
  if (d.ndim < -1 || d.ndim > kMaxDims)
    return "bad number of dimensions";
  if ((d.ndim >= 0) != (d.dtype >= 0))
    return "a shape without a dtype";
  for (int i = 0; i < d.ndim; ++i) {
    if (d.dims[i] < 0)
      return "a negative dimension";
  }
  return nullptr;
}

// A text field of a descriptor: bounded, since a peer's bytes need not end
// in a terminator.
template <size_t N>
std::string field(const char (&text)[N]) {
  return std::string(text, strnlen(text, N));
}

// What must agree across ranks for this op, as text: ranks are grouped by it.
std::string signature(const Descriptor& d) {
  auto kind = static_cast<OpKind>(d.kind);
  std::ostringstream os;
  os << to_string(kind);
  if (d.op >= 0)
    os << "(" << to_string(static_cast<ReduceOp>(d.op)) << ")";
  if (d.root >= 0)
    os << "(root " << d.root << ")";
  if (kind != OpKind::Barrier && kind != OpKind::Join)
    os << " " << shape_text(d, ragged(kind));
  if (d.name[0] != '\0')
    os << " '" << field(d.name) << "'";
  if (d.backend[0] != '\0')
    os << " on " << field(d.backend);
  return os.str();
}

// Whether two descriptors call for the same collective: every field of the
// signature, compared as bytes (dims past ndim and text past its end are
// zero on both sides). The dim 0 of a ragged collective may differ.
bool same_call(const Descriptor& a, const Descriptor& b) {
  if (a.kind != b.kind || a.op != b.op || a.root != b.root)
    return false;
  const auto kind = static_cast<OpKind>(a.kind);
  if (kind != OpKind::Barrier && kind != OpKind::Join) {
    if (a.dtype != b.dtype || a.ndim != b.ndim)
      return false;
    const int first = ragged(static_cast<OpKind>(a.kind)) ? 1 : 0;
    if (std::memcmp(
            a.dims + first,
            b.dims + first,
            sizeof(int64_t) * (kMaxDims - first)) != 0)
      return false;
  }
  return std::memcmp(a.name, b.name, sizeof(a.name)) == 0 &&
         std::memcmp(a.backend, b.backend, sizeof(a.backend)) == 0;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < ranks.size(); ++i)
    os << (i ? ", " : "") << ranks[i];
  return os.str();
}

[[noreturn]] void throw_mismatch(const std::vector<Descriptor>& all, int me) {
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < all.size(); ++r)
    groups[signature(all[r])].push_back(static_cast<int>(r));
  std::ostringstream os;
  os << "ronde: ranks disagree on a collective (seen on rank " << me << "): ";
  // Order by lowest rank so every rank prints the same message.
  std::vector<std::pair<int, std::string>> ordered;
  for (auto& [sig, ranks] : groups)
    ordered.emplace_back(ranks.front(), rank_list(ranks) + " called " + sig);
  std::sort(ordered.begin(), ordered.end());
  bool first = true;
  for (auto& [_, text] : ordered) {
    os << (first ? "" : "; ") << text;
    first = false;
  }
  TORCH_CHECK(false, os.str());
}

}  // namespace

bool ragged(OpKind kind) {
  return kind == OpKind::Allgather || kind == OpKind::Alltoall;
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::Allreduce:
      return "allreduce";
    case OpKind::Allgather:
      return "allgather";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::Alltoall:
      return "alltoall";
    case OpKind::Reducescatter:
      return "reducescatter";
    case OpKind::Barrier:
      return "barrier";
    case OpKind::Join:
      return "join";
  }
  return "unknown";
}

const char* profiler_range(OpKind k) {
  // "ronde::" and the kind's name, made once.
  constexpr int kKinds = static_cast<int>(OpKind::Join) + 1;
  static const std::array<std::string, kKinds> names = [] {
    std::array<std::string, kKinds> n;
    for (int i = 0; i < kKinds; ++i)
      n[i] = std::string("ronde::") + to_string(static_cast<OpKind>(i));
    return n;
  }();
  const int i = static_cast<int>(k);
  return i >= 0 && i < kKinds ? names[i].c_str() : "ronde::collective";
}

Descriptor describe(
    OpKind kind,
    const at::Tensor& t,
    const std::string& name,
    int op,
    int root,
    const std::string& backend,
    std::string& error) {
  Descriptor d;
  d.kind = static_cast<int32_t>(kind);
  d.op = op;
  d.root = root;
  copy_text(d.name, sizeof(d.name), name);
  copy_text(d.backend, sizeof(d.backend), backend);
  if (kind != OpKind::Barrier && kind != OpKind::Join) {
    if (!t.defined()) {
      error = "the tensor is undefined";
    } else {
      d.dtype = static_cast<int32_t>(t.scalar_type());
      d.ndim = static_cast<int32_t>(t.dim());
      if (t.dim() > kMaxDims) {
        error = "tensors of more than 16 dimensions are not supported";
        d.ndim = kMaxDims;
      }
      for (int i = 0; i < d.ndim; ++i)
        d.dims[i] = t.size(i);
    }
  }
  copy_text(d.error, sizeof(d.error), error);
  return d;
}

int64_t described_bytes(const Descriptor& d) {
  if (malformed(d) != nullptr || d.dtype < 0 || d.ndim < 0)
    return 0;
  int64_t bytes = element_bytes(d.dtype);
  for (int i = 0; i < d.ndim && i < kMaxDims; ++i) {
    // A peer's dims may multiply past any real tensor: saturate.
    if (__builtin_mul_overflow(bytes, d.dims[i], &bytes))
      return INT64_MAX;
  }
  return bytes;
}

uint64_t fingerprint(const Descriptor& d) {
  // Every field before the complaint, eight bytes at a time, but for the
  // words that are zero on every rank whatever the call (unused bytes are
  // zero): the dims past ndim and the name past the word of its
  // terminator. A ragged call's dim 0 counts as zero. FNV-1a's step on
  // words, then a final mix. Read in place: this runs on every checked
  // call, and a short name and few dims make it a quarter of the words.
  static_assert(offsetof(Descriptor, dims) % sizeof(uint64_t) == 0);
  static_assert(offsetof(Descriptor, backend) % sizeof(uint64_t) == 0);
  static_assert(offsetof(Descriptor, name) % sizeof(uint64_t) == 0);
  static_assert(sizeof(Descriptor::name) % sizeof(uint64_t) == 0);
  static_assert(
      offsetof(Descriptor, backend) + sizeof(Descriptor::backend) ==
      offsetof(Descriptor, name));
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t w) { h = (h ^ w) * 0x100000001b3ull; };
  auto word = [](const void* at) {
    uint64_t w;
    std::memcpy(&w, at, sizeof(w));
    return w;
  };
  const char* base = reinterpret_cast<const char*>(&d);
  for (size_t at = 0; at < offsetof(Descriptor, dims); at += 8)
    mix(word(base + at));
  const int ndim = std::clamp(d.ndim, 0, kMaxDims);
  const bool skip_dim0 = ragged(static_cast<OpKind>(d.kind));
  for (int i = 0; i < ndim; ++i)
    mix(i == 0 && skip_dim0 ? 0 : static_cast<uint64_t>(d.dims[i]));
  for (size_t at = 0; at < sizeof(d.backend); at += 8)
    mix(word(d.backend + at));
  for (size_t at = 0; at < sizeof(d.name); at += 8) {
    mix(word(d.name + at));
    if (std::memchr(d.name + at, 0, 8) != nullptr)
      break;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

size_t inline_capacity(int ranks) {
  if (ranks <= 16)
    return 4096;
  return std::max<size_t>(512, (size_t{65536} / ranks) & ~size_t{63});
}

size_t frame_bytes(int ranks) {
  return sizeof(FrameHeader) + inline_capacity(ranks);
}

void encode_frame(
    const FrameHeader& head, const void* payload, uint8_t* frame, size_t size) {
  const size_t carried =
      (head.flags & kFrameInline) ? static_cast<size_t>(head.inline_bytes) : 0;
  TORCH_INTERNAL_ASSERT(
      head.inline_bytes >= 0 && sizeof(FrameHeader) + carried <= size,
      "ronde: collective frame overflow");
  std::memcpy(frame, &head, sizeof(head));
  if (carried > 0)
    std::memcpy(frame_payload(frame), payload, carried);
  std::memset(
      frame + sizeof(FrameHeader) + carried,
      0,
      size - sizeof(FrameHeader) - carried);
}

FrameHeader decode_frame_header(const uint8_t* frame, int rank) {
  FrameHeader head;
  std::memcpy(&head, frame, sizeof(head));
  // Not a frame: the ranks are out of step (a rank left this job for a new
  // one while the others still run collectives in it).
  TORCH_CHECK(
      head.magic == kDescriptorMagic,
      "ronde: rank ",
      rank,
      " sent something other than a collective's frame: the ranks are out ",
      "of step (did it leave this job, or init() a new one, while the ",
      "others still run collectives here?)");
  return head;
}

void check_descriptors(const std::vector<Descriptor>& all, int me) {
  TORCH_INTERNAL_ASSERT(!all.empty(), "no descriptors to check");
  bool agree = true;
  bool complaint = false;
  for (size_t r = 0; r < all.size(); ++r) {
    // A peer's bytes, not this process's invariant: every rank sees the
    // same descriptors, so every rank fails with this message.
    const char* bad = malformed(all[r]);
    TORCH_CHECK(
        bad == nullptr,
        "ronde: corrupt collective descriptor from rank ",
        r,
        " (",
        bad ? bad : "",
        "): another ronde version, or memory corruption");
    agree = agree && same_call(all[0], all[r]);
    complaint = complaint || all[r].error[0] != '\0';
  }
  if (!agree)
    throw_mismatch(all, me);
  if (!complaint)
    return;
  std::ostringstream errors;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].error[0] != '\0') {
      errors << (errors.tellp() > 0 ? "; " : "") << "rank " << r << ": "
             << field(all[r].error);
    }
  }
  const Descriptor& mine = all[static_cast<size_t>(me)];
  // A bad argument (c10::ValueError, a c10::Error): Python's ValueError,
  // as Horovod raises for bad splits, roots and scale factors.
  TORCH_CHECK_VALUE(
      false,
      "ronde: ",
      to_string(static_cast<OpKind>(mine.kind)),
      mine.name[0] ? " of '" + field(mine.name) + "'" : "",
      " rejected: ",
      errors.str());
}

}  // namespace ronde::detail
