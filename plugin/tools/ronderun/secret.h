// The job secret (docs/security.md): the file RONDE_JOB_SECRET_FILE names,
// else a fresh 256-bit one in a private file that only this job's ranks
// are told of, removed when the job ends. Never on a command line or in
// the environment: only the file's path is.
#pragma once

#include <string>

namespace ronde::detail {

class JobSecret {
 public:
  JobSecret() = default;
  JobSecret(const JobSecret&) = delete;
  JobSecret& operator=(const JobSecret&) = delete;
  ~JobSecret() {
    remove();
  }

  // `given`: RONDE_JOB_SECRET_FILE's value (null or empty: make one under
  // `tmpdir`, "/tmp" when null or empty). The bytes are read only when
  // `remote`, to hand them to ranks on other hosts; the ranks here read
  // (and check) the file themselves. Returns an error, or "".
  std::string prepare(const char* given, bool remote, const char* tmpdir);

  // Removes the file and directory this job made; a given file stays.
  void remove();

  // The file the local ranks are told of; empty before prepare().
  const std::string& file() const {
    return file_;
  }
  // What a remote rank gets on its stdin; empty when no rank needs it.
  const std::string& bytes() const {
    return bytes_;
  }

 private:
  std::string read_given(const char* given);
  std::string make_fresh(const char* tmpdir);
  std::string write_file();

  std::string bytes_;
  std::string file_;
  std::string dir_;  // set only when this job made the file
};

}  // namespace ronde::detail
