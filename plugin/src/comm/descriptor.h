// The cross-rank check of a collective: before a collective runs, every rank
// contributes a small fixed-size descriptor of its call (kind, op, dtype,
// shape, root, name, backend, and any complaint about its own input), and
// every rank checks all of them alike. A mismatch then fails on every rank
// with the same message instead of hanging or corrupting memory. See
// README.md, "Collectives"; comm/call_check.cpp runs the exchange.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace ronde::detail {

enum class OpKind : int32_t {
  Allreduce = 1,
  Allgather,
  Broadcast,
  Alltoall,
  Reducescatter,
  Barrier,
  // A rank in ronde::join(): it answers whatever the others call.
  Join,
};

const char* to_string(OpKind k);
// The PyTorch profiler range of a collective ("ronde::allreduce").
const char* profiler_range(OpKind k);
// Whether ranks may pass different dim 0s (allgather, alltoall).
bool ragged(OpKind kind);

constexpr uint32_t kDescriptorMagic = 0x524f4e44;  // "ROND"
constexpr int kMaxDims = 16;

// Fixed-size and trivially copyable: it travels as raw bytes. Unused bytes
// are zero, so two descriptors of the same call compare equal as bytes.
struct Descriptor {
  uint32_t magic = kDescriptorMagic;
  int32_t kind = 0;
  int32_t dtype = -1;  // at::ScalarType, -1 for none
  int32_t op = -1;     // ronde::ReduceOp, -1 for none
  int32_t root = -1;
  int32_t ndim = -1;
  int64_t dims[kMaxDims] = {0};
  // The backend serving the tensor when it is not the job's host backend
  // (a CUDA tensor on NCCL); empty otherwise.
  char backend[16] = {0};
  char name[128] = {0};
  char error[200] = {0};  // this rank's own complaint about its input
};
static_assert(std::is_trivially_copyable_v<Descriptor>);

// This rank's descriptor of a call on `t` (undefined for a barrier). `error`
// is the caller's complaint about its input, if any; a tensor the descriptor
// cannot carry (too many dimensions) adds one.
Descriptor describe(
    OpKind kind,
    const at::Tensor& t,
    const std::string& name,
    int op,
    int root,
    const std::string& backend,
    std::string& error);

// The bytes of a tensor described by `d` (0 without one).
int64_t described_bytes(const Descriptor& d);

// A 64-bit hash of what must agree across ranks: the descriptor less the
// dim 0 of a ragged collective and less the complaint. Equal for two calls
// that check_descriptors() would accept together.
uint64_t fingerprint(const Descriptor& d);

// What each rank sends first for a checked call (comm/call_check.cpp): its
// descriptor's fingerprint, its dim 0, and, for a small input, the input's
// bytes after the header, in a frame whose size every rank of the job knows
// without being told (frame_bytes()), so that no disagreement can make ranks
// exchange different sizes. The full descriptors are exchanged only when the
// frames do not settle the check: a first call, a mismatch, a complaint.
struct FrameHeader {
  uint32_t magic = kDescriptorMagic;
  uint32_t flags = 0;
  uint64_t fingerprint = 0;
  int64_t dim0 = 0;
  int64_t inline_bytes = 0;  // payload bytes after the header
};
static_assert(sizeof(FrameHeader) == 32);
constexpr uint32_t kFrameComplaint = 1;   // this rank reports an error
constexpr uint32_t kFrameUnverified = 2;  // not yet verified in full here
constexpr uint32_t kFrameInline = 4;      // the payload follows the header
constexpr uint32_t kFrameJoined = 8;      // a rank in ronde::join()
// The rank's all-reduce input follows its frame in the same exchange
// (Communicator::exchange_frames).
constexpr uint32_t kFrameFused = 16;

// The payload bytes a frame carries in a job of `ranks`: 4 KiB up to 16
// ranks, then 64 KiB / ranks (at least 512), so that a frame exchange moves
// at most about 64 KiB per rank. (Over shared memory frames carry none:
// see Communicator::prefers_inline_payloads().)
size_t inline_capacity(int ranks);
size_t frame_bytes(int ranks);

// The frame codec. Here, beside the layout it writes, rather than with the
// exchange: it is bytes only (no communicator, no job), and a frame comes
// from a peer as a descriptor does, so it is read under the same rules.
//
// Writes `head` and, when it has kFrameInline, head.inline_bytes bytes of
// `payload` into `frame` (`size` bytes, at least the header and payload);
// the rest is zero, so that equal calls send equal bytes.
void encode_frame(
    const FrameHeader& head, const void* payload, uint8_t* frame, size_t size);
// The header of rank `rank`'s frame (`frame`, read unaligned). Throws
// c10::Error for a frame that is not one (bad magic number).
FrameHeader decode_frame_header(const uint8_t* frame, int rank);
// Where a frame's payload starts.
inline uint8_t* frame_payload(uint8_t* frame) {
  return frame + sizeof(FrameHeader);
}

// Checks every rank's descriptor (`all`, in rank order) as seen by `me`.
// Throws c10::Error, with the same message on every rank, when the ranks
// disagree on the call or any rank reported a problem with its input. Ranks
// that agree cost a byte comparison each; text is built only for a mismatch.
void check_descriptors(const std::vector<Descriptor>& all, int me);

}  // namespace ronde::detail
