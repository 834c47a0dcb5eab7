// The worker's scenarios by name. Each topic file (worker_*.cpp) registers
// its own with RONDE_SCENARIO; main() (worker_main.cpp) looks argv[1] up.
#pragma once

#include <map>
#include <string>

namespace ronde::testing {

// A scenario gets the worker's whole command line (argv[1] is its name) and
// returns the process's exit code.
using ScenarioFn = int (*)(int argc, char** argv);

// Registrations run while each object file's statics are initialised, in an
// order the linker chooses: the map is a function-local static so that it
// exists before the first of them, whichever file that is.
std::map<std::string, ScenarioFn>& scenario_registry();

// Adds name -> fn; a name registered twice aborts at start-up, naming it.
struct ScenarioRegistration {
  ScenarioRegistration(const char* name, ScenarioFn fn);
};

}  // namespace ronde::testing

// RONDE_SCENARIO(name) { ... } defines the scenario `name`, with argc and
// argv in scope. The worker is linked from an OBJECT library, so every
// registration is linked in; from a static library the linker would drop
// the object files that nothing references, and their scenarios with them.
#define RONDE_SCENARIO(name)                                             \
  static int ronde_scenario_##name(int argc, char** argv);               \
  static const ::ronde::testing::ScenarioRegistration                    \
      ronde_scenario_registration_##name(#name, &ronde_scenario_##name); \
  static int ronde_scenario_##name(                                      \
      [[maybe_unused]] int argc, [[maybe_unused]] char** argv)
