// ronderun: starts the ranks of a training command with the RONDE_*
// rendezvous environment (N local ranks, or several hosts' ranks through a
// remote-command template such as ssh), tags their output by rank, and takes
// the whole job down as soon as one rank fails so that no rank is left
// waiting forever. The units it is made of live beside this file.

#include "launcher.h"
#include "options.h"
#include "timeline_dir.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

int main(int argc, char** argv) {
  using namespace ronde::detail;
  if (argc > 1 && std::strcmp(argv[1], "--merge-timelines") == 0) {
    return merge_timelines_command(argc, argv);
  }
  Options options;
  const std::string error = parse_args(argc, argv, options);
  if (options.help) {
    fputs(kUsage, stdout);
    return fflush(stdout) == 0 ? 0 : kFailureExitCode;
  }
  if (!error.empty()) {
    fprintf(stderr, "ronderun: %s\n%s", error.c_str(), kUsage);
    return kUsageExitCode;
  }
  return run_job(std::move(options));
}
