// The program the multirank tests start N times. argv[1] names a scenario;
// each scenario computes, on every rank, the expected result of every
// collective from the inputs all ranks generate deterministically, and
// exits non-zero with a message at the first difference. The scenarios
// live in worker_*.cpp, one file per topic, and register themselves.
#include "scenario_registry.h"
#include "worker_checks.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

namespace ronde::testing {

std::map<std::string, ScenarioFn>& scenario_registry() {
  static std::map<std::string, ScenarioFn> registry;
  return registry;
}

ScenarioRegistration::ScenarioRegistration(const char* name, ScenarioFn fn) {
  if (!scenario_registry().emplace(name, fn).second) {
    std::cerr << "worker: scenario '" << name << "' registered twice"
              << std::endl;
    std::abort();
  }
}

}  // namespace ronde::testing

int main(int argc, char** argv) {
  at::set_num_threads(1);
  ronde::testing::install_crash_report();
  const std::string name = argc > 1 ? argv[1] : "";
  const auto& registry = ronde::testing::scenario_registry();
  const auto it = registry.find(name);
  if (it == registry.end()) {
    std::cerr << "unknown scenario '" << name << "'" << std::endl;
    std::cerr << "known scenarios:";
    for (const auto& [known, fn] : registry)
      std::cerr << " " << known;
    std::cerr << std::endl;
    return 2;
  }
  try {
    return it->second(argc, argv);
  } catch (const std::exception& e) {
    std::cout << "UNCAUGHT: " << e.what() << std::endl;
    return 2;
  }
}
