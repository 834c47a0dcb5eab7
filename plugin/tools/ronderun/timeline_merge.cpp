#include "timeline_merge.h"

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

namespace ronde::detail {

namespace {

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos)
    return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The number after "pid": in an event line, or -1.
long long pid_of(const std::string& event) {
  const auto at = event.find("\"pid\":");
  if (at == std::string::npos)
    return -1;
  long long pid = 0;
  size_t i = at + 6;
  if (i >= event.size() || event[i] < '0' || event[i] > '9')
    return -1;
  for (; i < event.size() && event[i] >= '0' && event[i] <= '9'; ++i)
    pid = pid * 10 + (event[i] - '0');
  return pid;
}

}  // namespace

bool complete_event(const std::string& line) {
  std::string s = trimmed(line);
  if (!s.empty() && s.back() == ',')
    s.pop_back();
  if (s.size() < 2 || s.front() != '{' || s.back() != '}')
    return false;
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[')
      ++depth;
    else if (c == '}' || c == ']')
      --depth;
    // The object closes only at its last character.
    if (depth == 0 && i + 1 < s.size())
      return false;
    if (depth < 0)
      return false;
  }
  return depth == 0 && !in_string;
}

TimelineMerge merge_timelines(
    const std::vector<std::string>& inputs, const std::string& out) {
  TimelineMerge m;
  const std::string tmp = out + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    m.error = "cannot write '" + tmp + "': " + std::strerror(errno);
    return m;
  }
  bool first = true;
  auto put = [&](const std::string& event) {
    std::fputs(first ? "\n" : ",\n", f);
    std::fputs(event.c_str(), f);
    first = false;
    ++m.events;
  };
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", f);
  std::set<long long> sorted;
  for (const std::string& path : inputs) {
    std::ifstream in(path);
    if (!in) {
      m.unreadable.push_back(path + ": " + std::strerror(errno));
      continue;
    }
    ++m.files;
    bool torn = false;
    for (std::string line; std::getline(in, line);) {
      std::string event = trimmed(line);
      if (event.empty() || event == "[" || event == "]")
        continue;
      if (!complete_event(event)) {
        torn = true;  // only a torn last line fails this
        continue;
      }
      if (event.back() == ',')
        event.pop_back();
      put(event);
      // Ranks in rank order, whatever order the viewer meets them in.
      const long long pid = pid_of(event);
      if (pid >= 0 && sorted.insert(pid).second) {
        put("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" +
            std::to_string(pid) +
            ",\"args\":{\"sort_index\":" + std::to_string(pid) + "}}");
      }
    }
    if (torn)
      m.torn.push_back(path);
  }
  std::fputs("\n]}\n", f);
  const bool written = std::ferror(f) == 0;
  if (std::fclose(f) != 0 || !written) {
    m.error = "cannot write '" + tmp + "': " + std::strerror(errno);
    std::remove(tmp.c_str());
    return m;
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    m.error =
        "cannot rename '" + tmp + "' to '" + out + "': " + std::strerror(errno);
    std::remove(tmp.c_str());
  }
  return m;
}

}  // namespace ronde::detail
