// The launcher's timeline directory and merge command (see timeline_dir.h).
#include "timeline_dir.h"

#include "options.h"
#include "runtime/posix_io.h"
#include "timeline_merge.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

namespace ronde::detail {

std::string timeline_file(const std::string& dir, int rank) {
  return dir + "/timeline." + std::to_string(rank) + ".json";
}

std::string prepare_timeline_dir(const std::string& dir, int num_ranks) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return "--timeline: cannot create '" + dir + "': " + errno_text();
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return "--timeline: '" + dir + "' is not a directory";
  }
  for (int r = 0; r < num_ranks; ++r) {
    unlink(timeline_file(dir, r).c_str());
  }
  return "";
}

std::string merge_job_timeline(const std::string& dir, int num_ranks) {
  std::vector<std::string> files;
  std::string missing;
  for (int r = 0; r < num_ranks; ++r) {
    if (access(timeline_file(dir, r).c_str(), R_OK) == 0) {
      files.push_back(timeline_file(dir, r));
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  if (files.empty()) {
    return "--timeline: no rank wrote a timeline in '" + dir + "'";
  }
  const std::string out = dir + "/timeline.json";
  const TimelineMerge m = merge_timelines(files, out);
  if (!m.error.empty()) {
    return "--timeline: " + m.error;
  }
  std::string note = "timeline of " + std::to_string(m.files) + " rank(s) in " +
                     out + " (" + std::to_string(m.events) + " events)";
  if (!missing.empty()) {
    note += "; no file from rank(s) " + missing +
            " (another host's, or a rank that never started its timeline)";
  }
  for (const std::string& t : m.torn) {
    note += "; " + t + " ends mid-event, its complete events are kept";
  }
  return note;
}

int merge_timelines_command(int argc, char** argv) {
  if (argc < 4) {
    fprintf(
        stderr,
        "ronderun: --merge-timelines needs OUT and at least one "
        "FILE\n%s",
        kUsage);
    return kUsageExitCode;
  }
  std::vector<std::string> inputs(argv + 3, argv + argc);
  const TimelineMerge m = merge_timelines(inputs, argv[2]);
  for (const std::string& u : m.unreadable) {
    fprintf(stderr, "ronderun: cannot read %s\n", u.c_str());
  }
  for (const std::string& t : m.torn) {
    fprintf(
        stderr,
        "ronderun: %s ends mid-event; its complete events are kept\n",
        t.c_str());
  }
  if (!m.error.empty()) {
    fprintf(stderr, "ronderun: %s\n", m.error.c_str());
    return kFailureExitCode;
  }
  fprintf(
      stderr,
      "ronderun: %d timeline(s), %lld events in %s\n",
      m.files,
      m.events,
      argv[2]);
  return m.unreadable.empty() ? 0 : kFailureExitCode;
}

}  // namespace ronde::detail
