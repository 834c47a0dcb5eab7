// The layers (docs/architecture.md): a file under plugin/src includes
// private headers of its own layer and of the layers below it only;
// plugin/tools (ronderun) uses only LibTorch-free runtime headers; the
// bindings see the public headers only. And the size budget: no source
// file under plugin/ or bindings/ grows past kMaxLines unless it is on
// the allow-list with its reason.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Lower number, lower layer. optim/ and train/ share a level and may not
// include each other; init/ composes runtime/ and comm/; c10d/ (the
// torch.distributed backend) adapts the collectives.
const std::map<std::string, int> kLevel = {
    {"runtime", 0},
    {"comm", 1},
    {"init", 2},
    {"engine", 3},
    {"optim", 4},
    {"train", 4},
    {"c10d", 5},
};

// Longer files are split into units (CONTRIBUTING.md, "Layout").
constexpr int kMaxLines = 600;

// Files allowed past kMaxLines, each with the reason. Empty today: a file
// that needs to be here says why in the same commit that adds it.
const std::map<std::string, std::string> kLongFilesAllowed = {};

const fs::path& source_dir() {
  static const fs::path dir(RONDE_SOURCE_DIR);
  return dir;
}

bool is_source(const fs::path& p) {
  static const std::set<std::string> kExt = {".h", ".cpp", ".cu", ".cuh"};
  const std::string name = p.filename().string();
  const bool header_template =
      name.size() > 5 && name.compare(name.size() - 5, 5, ".h.in") == 0;
  return header_template || kExt.count(p.extension().string()) > 0;
}

std::vector<fs::path> sources_under(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && is_source(entry.path())) {
      out.push_back(entry.path());
    }
  }
  return out;
}

// The targets of a file's #include "..." lines.
std::vector<std::string> quoted_includes(const fs::path& file) {
  static const std::regex include(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::vector<std::string> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, include)) {
      out.push_back(m[1].str());
    }
  }
  return out;
}

// Whether a file includes LibTorch (or c10, ATen, pybind11), directly.
bool includes_libtorch(const fs::path& file) {
  static const std::regex torch(
      R"re(^\s*#\s*include\s+[<"](torch|ATen|c10|pybind11)/)re");
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, torch)) {
      return true;
    }
  }
  return false;
}

std::string layer_of(const fs::path& rel) {
  return rel.begin()->string();
}

TEST(Layering, IncludesPointDownOnly) {
  const fs::path src = source_dir() / "plugin" / "src";
  int files = 0;
  for (const fs::path& file : sources_under(src)) {
    const fs::path rel = fs::relative(file, src);
    const std::string mine = layer_of(rel);
    ASSERT_TRUE(kLevel.count(mine)) << rel << " is in no known layer";
    ++files;
    for (const std::string& inc : quoted_includes(file)) {
      const fs::path target(inc);
      const std::string theirs = layer_of(target);
      if (!kLevel.count(theirs))
        continue;  // a header next to the file, not a layer's
      if (theirs == mine)
        continue;
      EXPECT_LT(kLevel.at(theirs), kLevel.at(mine))
          << rel << " includes " << target << ": " << mine
          << " may not depend on " << theirs;
    }
  }
  EXPECT_GT(files, 20);
}

// ronderun links no LibTorch: it may use runtime/ headers that include
// none (and whose own runtime includes include none), and its own files.
TEST(Layering, ToolsUseLibTorchFreeRuntimeOnly) {
  const fs::path src = source_dir() / "plugin" / "src";
  const fs::path tools = source_dir() / "plugin" / "tools";
  int files = 0;
  for (const fs::path& file : sources_under(tools)) {
    const fs::path rel = fs::relative(file, source_dir());
    ++files;
    EXPECT_FALSE(includes_libtorch(file)) << rel << " includes LibTorch";
    // A breadth-first walk of the runtime headers it reaches.
    std::vector<std::string> pending = quoted_includes(file);
    std::set<std::string> seen;
    while (!pending.empty()) {
      const std::string inc = pending.back();
      pending.pop_back();
      const fs::path target(inc);
      const std::string theirs = layer_of(target);
      if (!kLevel.count(theirs) || !seen.insert(inc).second)
        continue;  // its own directory's header, or walked already
      EXPECT_EQ(theirs, "runtime") << rel << " reaches " << inc
                                   << ": the launcher may use runtime/ only";
      const fs::path header = src / target;
      ASSERT_TRUE(fs::exists(header)) << rel << " includes " << inc;
      EXPECT_FALSE(includes_libtorch(header))
          << rel << " reaches " << inc << ", which includes LibTorch";
      for (const std::string& next : quoted_includes(header)) {
        pending.push_back(next);
      }
    }
  }
  EXPECT_GT(files, 1);
}

// The bindings sit on top and see what a user sees: <ronde/...> and their
// own headers, never a private header of plugin/src.
TEST(Layering, BindingsUsePublicHeadersOnly) {
  const fs::path bindings = source_dir() / "bindings";
  int files = 0;
  for (const fs::path& file : sources_under(bindings)) {
    const fs::path rel = fs::relative(file, source_dir());
    ++files;
    for (const std::string& inc : quoted_includes(file)) {
      EXPECT_FALSE(kLevel.count(layer_of(fs::path(inc))))
          << rel << " includes the private header " << inc;
      EXPECT_TRUE(fs::exists(file.parent_path() / inc))
          << rel << " includes " << inc << ", not a header of bindings/";
    }
  }
  EXPECT_GT(files, 0);
}

TEST(SizeBudget, NoSourceFileOverBudget) {
  int files = 0;
  for (const char* top : {"plugin", "bindings"}) {
    for (const fs::path& file : sources_under(source_dir() / top)) {
      const std::string rel = fs::relative(file, source_dir()).string();
      ++files;
      std::ifstream in(file);
      int lines = 0;
      for (std::string line; std::getline(in, line);) {
        ++lines;
      }
      const auto allowed = kLongFilesAllowed.find(rel);
      if (allowed != kLongFilesAllowed.end()) {
        EXPECT_GT(lines, kMaxLines)
            << rel << " is " << lines << " lines: take it off the allow-list";
        continue;
      }
      EXPECT_LE(lines, kMaxLines)
          << rel << " is " << lines << " lines, over the budget of "
          << kMaxLines << ": split it into units, or add it to "
          << "kLongFilesAllowed with the reason";
    }
  }
  EXPECT_GT(files, 50);
}

// Every allow-list entry names a file that exists and gives a reason.
TEST(SizeBudget, AllowListNamesRealFilesWithReasons) {
  for (const auto& [path, reason] : kLongFilesAllowed) {
    EXPECT_TRUE(fs::exists(source_dir() / path)) << path << " does not exist";
    EXPECT_GE(reason.size(), 20u) << path << ": say why it may be long";
  }
}

}  // namespace
