// Scenarios of the security tests: a job held open while an intruder tries
// to join or forge it (hold, intruder, forge_store), and what ronderun
// gives a rank of the job secret (secret_probe).
#include <ronde/collectives.h>
#include <ronde/errors.h>
#include <ronde/runtime.h>

#include "scenario_registry.h"
#include "worker_checks.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

// Holds a job open until the test has tried to disturb it, then proves the
// job still works. argv[2] is a directory shared with the test.
int scenario_hold(const std::string& dir) {
  ronde::init();
  ronde::barrier();
  if (ronde::rank() == 0) {
    std::FILE* f = std::fopen((dir + "/ready").c_str(), "w");
    if (f)
      std::fclose(f);
  }
  struct stat st {};
  for (int i = 0; i < 600 && ::stat((dir + "/go").c_str(), &st) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  at::Tensor got = ronde::allreduce(
      at::ones({5}), ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(
      at::allclose(got, at::full({5}, double(ronde::size()))),
      "allreduce after the intruder");
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

RONDE_SCENARIO(hold) {
  return scenario_hold(argc > 2 ? argv[2] : "/tmp");
}

// Under ronderun: where the job secret is (a private file) and what it is
// (copied to <dir>/secret-<rank> for the test to look for), then a
// collective of the authenticated job, then every process's command line
// and environment as ps shows them.
int scenario_secret_probe(const std::string& dir) {
  const char* path = std::getenv("RONDE_JOB_SECRET_FILE");
  const char* rank_env = std::getenv("RONDE_RANK");
  CHECK_W(
      path != nullptr && rank_env != nullptr, "ronderun gave a secret file");
  if (path == nullptr || rank_env == nullptr)
    return 1;
  struct stat st {};
  CHECK_W(::stat(path, &st) == 0, "the secret file exists");
  std::cout << "SECRET_FILE mode " << std::oct << (st.st_mode & 0777)
            << std::dec << " at " << path << std::endl;
  {
    std::ifstream in(path, std::ios::binary);
    std::ofstream out(dir + "/secret-" + rank_env, std::ios::binary);
    out << in.rdbuf();
  }
  ronde::init();
  at::Tensor got = ronde::allreduce(
      at::ones({3}), ronde::AllreduceOptions().op(ronde::ReduceOp::Sum));
  CHECK_W(
      at::allclose(got, at::full({3}, double(ronde::size()))),
      "allreduce in an authenticated job");
  if (FILE* ps = ::popen("ps axeww -o args 2>&1", "r")) {
    char line[8192];
    while (std::fgets(line, sizeof line, ps) != nullptr)
      std::cout << "PS: " << line;
    ::pclose(ps);
  }
  ronde::shutdown();
  return ronde::testing::scenario_exit_code();
}

RONDE_SCENARIO(secret_probe) {
  return scenario_secret_probe(argc > 2 ? argv[2] : "/tmp");
}

// Not a rank: a process that knows the address of a job's store, not its
// secret, writes the values a rank would act on (security_test.cpp).
int scenario_forge_store(int port, const std::string& job) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(10);
  c10d::TCPStore store("127.0.0.1", so);
  auto put = [&](const std::string& key, const std::string& v) {
    store.set(
        "ronde/" + job + "/" + key, std::vector<uint8_t>(v.begin(), v.end()));
  };
  put("stall_shutdown", "forged: everyone close your connections");
  put("progress/1", "999999|forged");
  put("failed/1", "\x01");
  return 0;
}

RONDE_SCENARIO(forge_store) {
  if (argc <= 3) {
    std::cerr << "usage: worker forge_store PORT JOB" << std::endl;
    return 2;
  }
  return scenario_forge_store(std::atoi(argv[2]), argv[3]);
}

// Expects init() to be refused.
RONDE_SCENARIO(intruder) {
  try {
    ronde::init();
    std::cout << "INTRUDER_ADMITTED" << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cout << "REFUSED: " << e.what() << std::endl;
    return 4;
  }
}

}  // namespace
