// A small command-line parser for the examples: `--name value` or
// `--name=value`, `--help`, and a clear error for an unknown flag or a bad
// value. No LibTorch here.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace examples {

class Flags {
 public:
  Flags(int argc, char** argv, std::string about)
      : program_(argc > 0 ? argv[0] : "example"), about_(std::move(about)) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        help_ = true;
        continue;
      }
      if (a.rfind("--", 0) != 0) {
        throw std::invalid_argument("unexpected argument '" + a + "'");
      }
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        values_[a.substr(2, eq - 2)] = a.substr(eq + 1);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[a.substr(2)] = argv[++i];
      } else {
        // A switch (see boolean()); any other flag then says it needs a
        // value.
        values_[a.substr(2)] = "";
      }
    }
  }

  std::string str(
      const std::string& name, std::string def, const std::string& help) {
    describe(name, def, help);
    auto it = take(name);
    return it ? *it : def;
  }
  int64_t integer(
      const std::string& name, int64_t def, const std::string& help) {
    describe(name, std::to_string(def), help);
    auto it = take(name);
    if (!it) {
      return def;
    }
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(it->c_str(), &end, 10);
    if (it->empty() || *end != '\0' || errno != 0) {
      throw std::invalid_argument(
          "--" + name + " expects an integer, got '" + *it + "'");
    }
    return v;
  }
  // A switch: --name alone (or --name=1/0) turns it on (off).
  bool boolean(const std::string& name, const std::string& help) {
    describe(name, "off", help);
    auto it = take(name);
    if (!it)
      return false;
    const std::string v = *it;
    if (v.empty() || v == "1" || v == "true" || v == "on")
      return true;
    if (v == "0" || v == "false" || v == "off")
      return false;
    throw std::invalid_argument("--" + name + "=" + v + " is not on or off");
  }

  double real(const std::string& name, double def, const std::string& help) {
    std::ostringstream d;
    d << def;
    describe(name, d.str(), help);
    auto it = take(name);
    if (!it) {
      return def;
    }
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(it->c_str(), &end);
    if (it->empty() || *end != '\0' || errno != 0) {
      throw std::invalid_argument(
          "--" + name + " expects a number, got '" + *it + "'");
    }
    return v;
  }

  // After every flag was read: prints the help and returns false if --help
  // was given; throws on a flag nobody asked for.
  bool finish() {
    if (help_) {
      std::cout << about_ << "\n\nusage: " << program_ << " [flags]\n"
                << usage_.str();
      return false;
    }
    if (!values_.empty()) {
      throw std::invalid_argument(
          "unknown flag --" + values_.begin()->first + " (see --help)");
    }
    return true;
  }

 private:
  std::optional<std::string> take(const std::string& name) {
    auto it = values_.find(name);
    if (it == values_.end()) {
      return std::nullopt;
    }
    std::string v = it->second;
    values_.erase(it);
    return v;
  }
  void describe(
      const std::string& name,
      const std::string& def,
      const std::string& help) {
    usage_ << "  --" << name << " (default: " << (def.empty() ? "none" : def)
           << ")\n      " << help << "\n";
  }

  std::string program_;
  std::string about_;
  bool help_ = false;
  std::map<std::string, std::string> values_;
  std::ostringstream usage_;
};

}  // namespace examples
