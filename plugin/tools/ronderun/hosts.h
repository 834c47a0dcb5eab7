// Host lists (-H, --hostfile), the remote-command template (--rsh, {host})
// and the shell text ronderun builds for it: pure functions of their
// arguments, so each rule is tested without starting a process.
#pragma once

#include <string>
#include <vector>

namespace ronde::detail {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// Accepts only plain decimal digits, so "-1", " 3" and "3x" are all refused
// with the same message instead of being half-parsed by strtol.
bool parse_int(const std::string& text, long min, long max, long& value);

// "host0:2,host1" -> hosts with slots (1 when not given), appended to
// `hosts`. Returns an error that starts with `what`, or "".
std::string parse_host_list(
    const std::string& text,
    const std::string& what,
    std::vector<HostSlots>& hosts);

// One host per line, 'host slots=N' or 'host:N', '#' starting a comment.
// Returns an error, or "".
std::string read_hostfile(
    const std::string& path, std::vector<HostSlots>& hosts);

// Hosts started without the remote-command template.
bool is_local_host(const std::string& host);

// Quotes an argument only when needed, so a printed line can be pasted
// back into a shell.
std::string shell_quote(const std::string& arg);

// Splits the template into words at blanks; '...' and "..." group (no
// escapes inside), as a user would write the template on a command line.
std::vector<std::string> split_words(const std::string& text);

std::string replace_all(
    std::string text, const std::string& from, const std::string& to);

// How a rank on `host` is started: the template's words with {host}
// replaced, then one shell command line that cds to `cwd` (when given and
// present there), takes the job secret from stdin when `secret_on_stdin`,
// and execs `command` under `env`.
std::vector<std::string> remote_argv(
    const std::string& rsh,
    const std::string& host,
    const std::vector<std::string>& env,
    const std::string& cwd,
    const std::vector<std::string>& command,
    bool secret_on_stdin);

}  // namespace ronde::detail
