// What the shared-memory transport's tests share: ranks as forked
// processes that meet through a directory instead of a store, and scratch
// directories for the segments and the rendezvous, removed afterwards.
#pragma once

#include "../scratch_dir.h"
#include "comm/shm/shm_transport.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ronde::testing::shm_job {

namespace shm = ronde::detail::shm;

inline std::string make_dir(const std::string& under) {
  return ronde::testing::make_scratch_dir(under, "ronde_test");
}

inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        out.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

inline void remove_tree(const std::string& dir) {
  for (const auto& e : entries(dir))
    ::unlink((dir + "/" + e).c_str());
  ::rmdir(dir.c_str());
}

// A rendezvous through files: set() writes a file atomically, get() waits
// for it.
inline shm::Rendezvous file_rendezvous(
    const std::string& dir, const std::string& prefix = "") {
  shm::Rendezvous rv;
  auto path = [dir, prefix](std::string key) {
    key = prefix + key;
    for (char& c : key)
      c = c == '/' ? '_' : c;
    return dir + "/" + key;
  };
  rv.set = [path](const std::string& k, const std::string& v) {
    const std::string p = path(k);
    { std::ofstream(p + ".tmp") << v; }
    std::rename((p + ".tmp").c_str(), p.c_str());
  };
  rv.get = [path](const std::string& k) {
    const std::string p = path(k);
    for (int i = 0; i < 30000; ++i) {
      std::ifstream f(p);
      if (f) {
        std::stringstream s;
        s << f.rdbuf();
        return s.str();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw std::runtime_error("rendezvous key " + k + " never came");
  };
  return rv;
}

struct Job {
  std::string shm_dir;  // where the segments go
  std::string rv_dir;   // where the ranks meet
  std::vector<pid_t> pids;
  Job() {
    shm_dir = make_dir("/dev/shm");
    rv_dir = make_dir("/tmp");
  }
  ~Job() {
    for (pid_t p : pids) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    remove_tree(shm_dir);
    remove_tree(rv_dir);
  }
  shm::Options options(int rank, int size) const {
    shm::Options o;
    o.rank = rank;
    o.size = size;
    o.dir = shm_dir;
    o.chunk_bytes = 4096;
    o.timeout = std::chrono::milliseconds(20000);
    return o;
  }
  // Forks `size` ranks running body(rank); each exits with body's value.
  void start(int size, const std::function<int(int)>& body) {
    for (int r = 0; r < size; ++r) {
      pid_t p = ::fork();
      if (p == 0) {
        int rc = 99;
        try {
          rc = body(r);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          rc = 98;
        }
        std::fflush(stdout);
        std::fflush(stderr);
        ::_exit(rc);
      }
      pids.push_back(p);
    }
  }
  // Exit codes (128 + signal for a killed rank), in rank order.
  std::vector<int> wait() {
    std::vector<int> codes;
    for (pid_t p : pids) {
      int st = 0;
      ::waitpid(p, &st, 0);
      codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    pids.clear();
    return codes;
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(rv_dir + "/" + name) << text;
  }
  std::string read(const std::string& name) const {
    std::ifstream f(rv_dir + "/" + name);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
};

}  // namespace ronde::testing::shm_job
