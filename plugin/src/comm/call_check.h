// The cross-rank check of a call, as a job runs it before the collective's
// body: the frame exchange, the full descriptors when the frames do not
// settle it, and what each member of a set remembers between calls (the
// calls verified in full, who is in ronde::join()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace ronde::detail {

class Communicator;
struct Call;
struct Exchanged;
struct Group;

// How many verified calls a set remembers. A training step makes a few
// dozen distinct calls (a bucket each, the named broadcasts), so this is
// far above any steady loop; it bounds the cache (under 200 KiB) for a
// program that names calls anew every time (a step count in the name),
// which then pays a full exchange again after each clear.
constexpr size_t kMaxVerifiedCalls = 4096;

// The fingerprints of calls whose descriptors every member checked in full.
// Touched only by the set's running job, one at a time; every member adds
// (and clears) the same ones at the same calls, since each decides from the
// same frames, so the sets stay equal across members.
class VerifiedCalls {
 public:
  bool contains(uint64_t fingerprint) const {
    return fingerprints_.count(fingerprint) != 0;
  }
  // Clears the cache first when it is full: on every member at once.
  void add(uint64_t fingerprint);
  void clear() {
    fingerprints_.clear();
  }

 private:
  std::unordered_set<uint64_t> fingerprints_;
};

// Join (ronde::join()) as the last checked call's frames showed it, the
// same on every member; touched only by the set's running job. While some
// but not all members have joined, every call is checked, so that the
// joined ones learn what to answer.
struct JoinState {
  std::vector<char> joined;  // by set rank; empty: nobody
  int last_joined = -1;      // the set rank that joined last so far

  bool anyone() const {
    return !joined.empty();
  }
};

// Checks `call` across the members of `g` on `comm` (the set's own) and
// returns what the body needs: every rank's descriptor, the payloads the
// frames carried, who is in ronde::join(). Throws the same c10::Error on
// every member when they disagree; BackendFailure when a peer fails.
Exchanged check_call(Communicator& comm, Group& g, const Call& call);

}  // namespace ronde::detail
