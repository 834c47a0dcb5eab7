// One Perfetto / chrome://tracing file from the per-rank timelines that
// RONDE_TIMELINE writes: a process track per rank, its threads under it.
// Used by ronderun (--timeline DIR, --merge-timelines OUT FILE...); no
// LibTorch here.
#pragma once

#include <string>
#include <vector>

namespace ronde::detail {

struct TimelineMerge {
  int files = 0;         // inputs merged
  long long events = 0;  // events written
  // Inputs that could not be read, each "path: reason".
  std::vector<std::string> unreadable;
  // Inputs that ended mid-event (a rank killed while writing): their
  // complete events are kept, the torn last line is not.
  std::vector<std::string> torn;
  std::string error;  // set when `out` could not be written
};

// Merges `inputs`, each a JSON array with one event per line (ronde's
// timeline format, also when its closing bracket is missing), into `out`
// as {"traceEvents": [...]}. The file appears whole or not at all.
TimelineMerge merge_timelines(
    const std::vector<std::string>& inputs, const std::string& out);

// Whether `line` (one event, a trailing comma allowed) is a complete JSON
// object: braces and brackets balanced outside strings, ending in '}'.
bool complete_event(const std::string& line);

}  // namespace ronde::detail
