// The layers of plugin/src (docs/architecture.md): a file includes private
// headers of its own layer and of the layers below it only.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

namespace {

namespace fs = std::filesystem;

// Lower number, lower layer. optim/ and train/ share a level and may not
// include each other; init.cpp composes runtime/ and comm/.
const std::map<std::string, int> kLevel = {
    {"runtime", 0},
    {"comm", 1},
    {"init.cpp", 2},
    {"engine", 3},
    {"optim", 4},
    {"train", 4},
};

std::string layer_of(const fs::path& rel) {
  return rel.begin()->string();
}

TEST(Layering, IncludesPointDownOnly) {
  const fs::path src = fs::path(RONDE_SOURCE_DIR) / "plugin" / "src";
  const std::regex include(R"re(^\s*#\s*include\s+"([^"]+)")re");
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file())
      continue;
    const fs::path rel = fs::relative(entry.path(), src);
    const std::string mine = layer_of(rel);
    ASSERT_TRUE(kLevel.count(mine)) << rel << " is in no known layer";
    ++files;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, include))
        continue;
      const fs::path target(m[1].str());
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

}  // namespace
