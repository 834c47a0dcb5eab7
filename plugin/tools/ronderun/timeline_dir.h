// --timeline DIR and --merge-timelines: the directory the ranks write
// their timelines to, and the merge of those files into one when the job
// ends (timeline_merge.h does the merging itself).
#pragma once

#include <string>

namespace ronde::detail {

// DIR/timeline.RANK.json, the file rank `rank` writes.
std::string timeline_file(const std::string& dir, int rank);

// Creates `dir` if needed and removes a previous job's files, which would
// otherwise be merged as this one's. Returns an error, or "".
std::string prepare_timeline_dir(const std::string& dir, int num_ranks);

// Merges the ranks' files into DIR/timeline.json; returns the note to print
// (what was merged, what was missing, or why nothing was).
std::string merge_job_timeline(const std::string& dir, int num_ranks);

// ronderun --merge-timelines OUT FILE...: returns the exit code.
int merge_timelines_command(int argc, char** argv);

}  // namespace ronde::detail
