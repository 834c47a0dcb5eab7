// The texts ranks leave for each other in the store: the peer record each
// rank publishes at init() and the progress record of the stall inspector.
// Their decoders take bytes that any process reaching the store could have
// written, so they check everything and never throw anything but
// std::runtime_error; no LibTorch, so they are fuzzed alone (tests/fuzz).
#pragma once

#include "runtime/net_address.h"

#include <cstdint>
#include <optional>
#include <string>

namespace ronde::detail {

// What each rank tells the others at init(): its host, the address it
// advertises and why, and where its launcher said it sits.
struct PeerInfo {
  std::string host;  // host_identity()
  AddressChoice address;
  int local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  std::string launcher;  // LaunchInfo::source
};

// One line per field; no field holds a newline (identities and addresses
// are the kernel's and the resolver's, sources are ronde's own).
std::string encode_peer(const PeerInfo& p);
// Throws std::runtime_error naming `rank` when the record is malformed.
PeerInfo decode_peer(const std::string& text, int rank);

// "<collectives started>|<what the last one was>".
struct ProgressRecord {
  int64_t started = 0;
  std::string what;
};
std::string encode_progress(const ProgressRecord& p);
// nullopt when the text is not a progress record.
std::optional<ProgressRecord> decode_progress(const std::string& text);

}  // namespace ronde::detail
