// Host lists, hostfiles and the remote-command template (see hosts.h).
#include "hosts.h"

#include "runtime/launch_contract.h"
#include "runtime/net_address.h"

#include <cctype>
#include <fstream>

namespace ronde::detail {
namespace {

bool is_blank(char c) {
  return isspace(static_cast<unsigned char>(c)) != 0;
}

// The blank-separated words of a hostfile line.
std::vector<std::string> line_words(const std::string& line) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_blank(line[i])) {
      ++i;
    }
    size_t j = i;
    while (j < line.size() && !is_blank(line[j])) {
      ++j;
    }
    if (j > i) {
      words.push_back(line.substr(i, j - i));
    }
    i = j;
  }
  return words;
}

// One "host[:slots]" item of a host list.
std::string parse_host_item(
    std::string item, const std::string& what, HostSlots& h) {
  // The slot count follows the last colon, unless the host is an IPv6
  // address in brackets: [fd00::1]:2.
  const size_t colon = item.rfind(':');
  const size_t bracket = item.rfind(']');
  if (colon != std::string::npos &&
      (bracket == std::string::npos || colon > bracket)) {
    long slots = 0;
    if (!parse_int(item.substr(colon + 1), 1, 1000000, slots)) {
      return what + ": '" + item + "' needs a positive slot count after ':'";
    }
    h.slots = static_cast<int>(slots);
    item = item.substr(0, colon);
  }
  if (item.size() > 2 && item.front() == '[' && item.back() == ']') {
    item = item.substr(1, item.size() - 2);
  }
  if (item.empty()) {
    return what + ": a host name is empty";
  }
  h.host = item;
  return "";
}

}  // namespace

bool parse_int(const std::string& text, long min, long max, long& value) {
  if (text.empty() || text.size() > 18) {
    return false;
  }
  long result = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      return false;
    }
    result = result * 10 + (c - '0');
  }
  if (result < min || result > max) {
    return false;
  }
  value = result;
  return true;
}

std::string parse_host_list(
    const std::string& text,
    const std::string& what,
    std::vector<HostSlots>& hosts) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) {
      comma = text.size();
    }
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) {
      continue;
    }
    HostSlots h;
    std::string error = parse_host_item(item, what, h);
    if (!error.empty()) {
      return error;
    }
    hosts.push_back(h);
  }
  return "";
}

std::string read_hostfile(
    const std::string& path, std::vector<HostSlots>& hosts) {
  std::ifstream in(path);
  if (!in) {
    return "--hostfile: cannot read '" + path + "'";
  }
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::vector<std::string> words =
        line_words(line.substr(0, line.find('#')));
    if (words.empty()) {
      continue;
    }
    const std::string where = path + ":" + std::to_string(number);
    std::string spec = words[0];
    if (words.size() == 2 && words[1].rfind("slots=", 0) == 0) {
      spec += ":" + words[1].substr(6);
    } else if (words.size() != 1) {
      return where + ": expected 'host slots=N' or 'host:N'";
    }
    std::string error = parse_host_list(spec, where, hosts);
    if (!error.empty()) {
      return error;
    }
  }
  if (hosts.empty()) {
    return "--hostfile: '" + path + "' names no host";
  }
  return "";
}

bool is_local_host(const std::string& host) {
  return host == "localhost" || is_loopback_address(host);
}

std::string shell_quote(const std::string& arg) {
  const bool plain =
      !arg.empty() &&
      arg.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
          "-_./=:,+@%") == std::string::npos;
  if (plain) {
    return arg;
  }
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char c : text) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (is_blank(c)) {
      if (in_word) {
        words.push_back(word);
        word.clear();
        in_word = false;
      }
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) {
    words.push_back(word);
  }
  return words;
}

std::string replace_all(
    std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::vector<std::string> remote_argv(
    const std::string& rsh,
    const std::string& host,
    const std::vector<std::string>& env,
    const std::string& cwd,
    const std::vector<std::string>& command,
    bool secret_on_stdin) {
  std::vector<std::string> argv;
  for (const std::string& w : split_words(rsh)) {
    argv.push_back(replace_all(w, "{host}", host));
  }
  std::string line;
  if (!cwd.empty()) {
    line = "cd " + shell_quote(cwd) + " 2>/dev/null; ";
  }
  if (secret_on_stdin) {
    // The secret arrives on stdin (spawn) into a private file that is
    // removed at once, kept open as fd 3: nothing of it stays on that
    // host's disk, whatever the rank does, and only the rank can read it.
    line += std::string(
                "umask 077; f=$(mktemp) && cat > \"$f\" && exec 3< \"$f\" "
                "&& rm -f \"$f\" || exit 1; export ") +
            kJobSecretFileVar + "=/dev/fd/3; ";
  }
  line += "exec env";
  for (const std::string& e : env) {
    line += " " + shell_quote(e);
  }
  for (const std::string& arg : command) {
    line += " " + shell_quote(arg);
  }
  argv.push_back(line);
  return argv;
}

}  // namespace ronde::detail
