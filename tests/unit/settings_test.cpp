// Settings (runtime/settings.h): the parsing of every variable, and the
// rule that keeps the guide true: its Settings table
// (docs/guide/settings.md) lists exactly the
// variables the code reads, and no file outside the settings and the launch
// environment reads the environment itself.
#include "runtime/settings.h"
#include "fake_env.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using ronde::detail::read_settings;
using ronde::detail::Settings;

Settings parse_settings(const std::map<std::string, std::string>& vars) {
  return read_settings(ronde::testing::fake_env(vars));
}

std::string settings_error_of(const std::map<std::string, std::string>& vars) {
  try {
    parse_settings(vars);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const fs::path kRoot = RONDE_SOURCE_DIR;

const fs::path kSettingsPage = fs::path("docs") / "guide" / "settings.md";
const fs::path kHostsPage = fs::path("docs") / "guide" / "hosts.md";

// The first column of the Settings table (the page's one table whose rows
// start with a variable).
std::set<std::string> guide_settings() {
  std::istringstream in(read_file(kRoot / kSettingsPage));
  std::set<std::string> names;
  const std::regex row(R"(^\| `([A-Z0-9_]+)` \|)");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row))
      names.insert(m[1]);
  }
  return names;
}

// The variables the "Launch variables" paragraph of the hosts page names.
std::set<std::string> guide_launch_variables() {
  const std::string text = read_file(kRoot / kHostsPage);
  const auto start = text.find("Launch variables, in order of precedence");
  const auto end = text.find("\n\n", start);
  EXPECT_NE(start, std::string::npos);
  const std::string para = text.substr(start, end - start);
  std::set<std::string> names;
  const std::regex name("`([A-Z][A-Z0-9_]+)`");
  for (std::sregex_iterator it(para.begin(), para.end(), name), e; it != e;
       ++it)
    names.insert((*it)[1]);
  return names;
}

TEST(Settings, SettingsTableListsExactlyTheVariablesTheCodeReads) {
  const auto& code = ronde::detail::setting_variables();
  const std::set<std::string> in_code(code.begin(), code.end());
  EXPECT_EQ(in_code.size(), code.size()) << "a variable listed twice";
  const std::set<std::string> in_guide = guide_settings();
  for (const auto& v : in_code)
    EXPECT_TRUE(in_guide.count(v))
        << v << " is read but not in " << kSettingsPage.string();
  for (const auto& v : in_guide)
    EXPECT_TRUE(in_code.count(v))
        << v << " is in " << kSettingsPage.string() << " but never read";
}

TEST(Settings, EveryVariableInTheSourcesIsDocumented) {
  const auto& code = ronde::detail::setting_variables();
  std::set<std::string> known(code.begin(), code.end());
  for (const auto& v : guide_launch_variables())
    known.insert(v);
  // A RONDE_ name inside a string literal is a variable read or named to
  // the user; macros and identifiers are not in quotes.
  const std::regex literal(R"("(?:[^"\\]|\\.)*")");
  const std::regex token(R"(\b(RONDE_[A-Z0-9_]+|USE_LIBUV)\b)");
  int files = 0;
  for (const auto& entry :
       fs::recursive_directory_iterator(kRoot / "plugin" / "src")) {
    const auto ext = entry.path().extension();
    if (ext != ".cpp" && ext != ".h")
      continue;
    ++files;
    const std::string text = read_file(entry.path());
    const std::string rel = fs::relative(entry.path(), kRoot).string();
    for (std::sregex_iterator it(text.begin(), text.end(), literal), e; it != e;
         ++it) {
      const std::string s = it->str();
      for (std::sregex_iterator t(s.begin(), s.end(), token), te; t != te;
           ++t) {
        EXPECT_TRUE(known.count((*t)[1]))
            << rel << " names " << (*t)[1]
            << ", which the guide documents neither as a setting nor as a "
               "launch variable";
      }
    }
    // Only the settings and the launch environment read the environment.
    if (rel != "plugin/src/runtime/launch_env.cpp") {
      EXPECT_EQ(text.find("getenv("), std::string::npos)
          << rel
          << " reads the environment itself: add the variable to "
             "runtime/settings.h instead";
    }
  }
  EXPECT_GT(files, 20) << "the sources were not found under " << kRoot;
}

TEST(Settings, DefaultsWhenNothingIsSet) {
  const Settings s = parse_settings({});
  EXPECT_FALSE(s.timeout_seconds);
  EXPECT_EQ(s.hostname, "");
  EXPECT_FALSE(s.gloo_deepbind);
  EXPECT_FALSE(s.blocking_wait);
  EXPECT_TRUE(s.use_libuv);
  EXPECT_FALSE(s.bucket_copy_whole);
  EXPECT_FALSE(s.log_all_ranks);
  EXPECT_FALSE(s.fusion_threshold_bytes);
  // Empty counts as unset.
  EXPECT_FALSE(parse_settings({{"RONDE_TIMEOUT_SECONDS", ""}}).timeout_seconds);
}

TEST(Settings, ValuesAreParsed) {
  const Settings s = parse_settings(
      {{"RONDE_TIMEOUT_SECONDS", "2.5"},
       {"RONDE_HOSTNAME", "198.18.0.1"},
       {"RONDE_GLOO_DEEPBIND", "0"},
       {"RONDE_BLOCKING_WAIT", "1"},
       {"RONDE_STALL_WARNING_SECONDS", "5"},
       {"RONDE_FUSION_THRESHOLD", "1048576"},
       {"USE_LIBUV", "0"},
       {"RONDE_BUCKET_COPY", "multi"},
       {"RONDE_AUTOTUNE", "1"},
       {"RONDE_LOG_ALL_RANKS", "true"},
       {"RONDE_CUDA_BACKEND", "gloo"},
       {"RONDE_TIMELINE", "/tmp/t.json"}});
  EXPECT_DOUBLE_EQ(*s.timeout_seconds, 2.5);
  EXPECT_EQ(s.hostname, "198.18.0.1");
  EXPECT_EQ(s.gloo_deepbind, std::optional<bool>(false));
  EXPECT_TRUE(s.blocking_wait);
  EXPECT_DOUBLE_EQ(*s.stall_warning_seconds, 5);
  EXPECT_DOUBLE_EQ(*s.fusion_threshold_bytes, 1048576);
  EXPECT_FALSE(s.use_libuv);
  EXPECT_EQ(s.bucket_copy_whole, std::optional<bool>(false));
  EXPECT_EQ(s.autotune, std::optional<bool>(true));
  EXPECT_FALSE(parse_settings({}).autotune);
  EXPECT_TRUE(s.log_all_ranks);
  EXPECT_EQ(s.cuda_backend, "gloo");
  EXPECT_EQ(s.timeline, "/tmp/t.json");
}

TEST(Settings, BadValuesNameTheVariable) {
  EXPECT_NE(
      settings_error_of({{"RONDE_TIMEOUT_SECONDS", "0"}})
          .find("RONDE_TIMEOUT_SECONDS='0' is not a positive number of "
                "seconds"),
      std::string::npos);
  EXPECT_NE(
      settings_error_of({{"RONDE_BLOCKING_WAIT", "sometimes"}})
          .find("RONDE_BLOCKING_WAIT='sometimes' is not a boolean"),
      std::string::npos);
  EXPECT_NE(
      settings_error_of({{"RONDE_CUDA_BACKEND", "mpi"}})
          .find("RONDE_CUDA_BACKEND must be 'nccl' or 'gloo', not 'mpi'"),
      std::string::npos);
  EXPECT_NE(
      settings_error_of({{"RONDE_FUSION_THRESHOLD", "big"}})
          .find("RONDE_FUSION_THRESHOLD='big' is not a positive number of "
                "bytes"),
      std::string::npos);
}

}  // namespace

namespace {

TEST(Settings, SharedMemoryVariables) {
  Settings d = parse_settings({});
  EXPECT_TRUE(d.shm);
  EXPECT_EQ(d.shm_tuning.dir, "/dev/shm");
  EXPECT_EQ(d.shm_tuning.chunk_bytes, 512u << 10);
  EXPECT_FALSE(d.shm_tuning.split_bytes);
  // Unset: never split between two ranks, from 1 MiB between more.
  EXPECT_EQ(d.shm_tuning.split_bytes_for(2), SIZE_MAX);
  EXPECT_EQ(d.shm_tuning.split_bytes_for(3), 1u << 20);
  EXPECT_EQ(d.shm_tuning.zero_copy_min_bytes, 4096u);
  Settings s = parse_settings(
      {{"RONDE_SHM", "0"},
       {"RONDE_SHM_DIR", "/run/shm"},
       {"RONDE_SHM_CHUNK_BYTES", "65536"},
       {"RONDE_SHM_SPLIT_BYTES", "0"},
       {"RONDE_SHM_ZERO_COPY_BYTES", "0"}});
  EXPECT_FALSE(s.shm);
  EXPECT_EQ(s.shm_tuning.dir, "/run/shm");
  EXPECT_EQ(s.shm_tuning.chunk_bytes, 65536u);
  EXPECT_EQ(s.shm_tuning.split_bytes, 0u);
  EXPECT_EQ(s.shm_tuning.split_bytes_for(2), 0u);
  EXPECT_EQ(s.shm_tuning.zero_copy_min_bytes, 0u);
  EXPECT_NE(
      settings_error_of({{"RONDE_SHM_CHUNK_BYTES", "1024"}})
          .find("RONDE_SHM_CHUNK_BYTES='1024' is below the smallest chunk"),
      std::string::npos);
  for (const char* bad : {"-1", "1e6", "64K", "x"}) {
    EXPECT_NE(
        settings_error_of({{"RONDE_SHM_ZERO_COPY_BYTES", bad}})
            .find("is not a whole number of bytes"),
        std::string::npos)
        << bad;
    EXPECT_NE(
        settings_error_of({{"RONDE_SHM_SPLIT_BYTES", bad}})
            .find("is not a whole number of bytes"),
        std::string::npos)
        << bad;
  }
  EXPECT_NE(
      settings_error_of({{"RONDE_SHM", "maybe"}}).find("RONDE_SHM='maybe'"),
      std::string::npos);
}

// RONDE_HELP_BYTES bounds the collectives a waiting thread runs itself.
TEST(Settings, HelpBytes) {
  EXPECT_FALSE(parse_settings({}).help_bytes);
  EXPECT_EQ(parse_settings({{"RONDE_HELP_BYTES", "0"}}).help_bytes, size_t{0});
  EXPECT_EQ(
      parse_settings({{"RONDE_HELP_BYTES", "65536"}}).help_bytes,
      size_t{65536});
  EXPECT_NE(
      settings_error_of({{"RONDE_HELP_BYTES", "16K"}})
          .find("RONDE_HELP_BYTES='16K' is not a whole number of bytes"),
      std::string::npos);
}

TEST(Settings, AcrossHostsVariables) {
  Settings d = parse_settings({});
  EXPECT_EQ(d.socket_ifname, "");
  EXPECT_FALSE(d.hierarchical);
  // RONDE_SOCKET_IFNAME wins over GLOO_SOCKET_IFNAME; each says its name.
  Settings s = parse_settings(
      {{"RONDE_SOCKET_IFNAME", "^docker,lo"},
       {"GLOO_SOCKET_IFNAME", "eth1"},
       {"RONDE_HIERARCHICAL", "0"}});
  EXPECT_EQ(s.socket_ifname, "^docker,lo");
  EXPECT_EQ(s.socket_ifname_variable, "RONDE_SOCKET_IFNAME");
  EXPECT_EQ(s.hierarchical, std::optional<bool>(false));
  s = parse_settings(
      {{"GLOO_SOCKET_IFNAME", "eth1"}, {"RONDE_SOCKET_IFNAME", ""}});
  EXPECT_EQ(s.socket_ifname, "eth1");
  EXPECT_EQ(s.socket_ifname_variable, "GLOO_SOCKET_IFNAME");
  EXPECT_NE(
      settings_error_of({{"RONDE_HIERARCHICAL", "auto"}})
          .find("RONDE_HIERARCHICAL='auto'"),
      std::string::npos);
}

}  // namespace
