// The ranks' output on its way to ronderun's own stdout and stderr: whole
// lines only, each tagged "[rank] " in the same write() as its text, so the
// lines of different ranks never interleave; and the launcher's messages.
#pragma once

#include <cstddef>
#include <string>

namespace ronde::detail {

// One of a rank's two output pipes.
struct OutputStream {
  int fd = -1;          // read end of the rank's pipe; -1 once closed
  int sink = -1;        // ronderun's own stdout or stderr
  std::string pending;  // bytes after the last newline seen
};

// "[3] ", the tag of rank 3's lines.
std::string rank_prefix(int rank);

// `data` with `prefix` before each line (the last one may lack its '\n').
std::string tag_lines(const std::string& prefix, const char* data, size_t size);

// Appends `data` to `pending` and returns how many bytes at its front now
// form complete lines (0: none yet). Only the new bytes are scanned, so a
// long line arriving in many chunks stays linear.
size_t append_and_find_lines(
    std::string& pending, const char* data, size_t size);

// ronderun's stdout and stderr. A reader that went away (`| head`, a closed
// terminal) must not stop the supervision of the ranks, so what would go
// to a broken sink is dropped from then on.
class Sinks {
 public:
  void write(int fd, const char* data, size_t size);
  // "ronderun: TEXT\n" on stderr.
  void message(const std::string& text);

 private:
  bool broken_[3] = {false, false, false};
};

}  // namespace ronde::detail
