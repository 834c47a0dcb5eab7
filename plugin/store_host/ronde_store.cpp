// ronde_store: hosts the rendezvous store of an elastic job for ronderun
// (ronderun --min-np), so that the store outlives every rank: losing rank 0,
// or its host, does not take the store with it. A LibTorch c10d TCPStore
// server, the same the ranks host themselves in a job that is not elastic.
// It prints "ready PORT" once it serves, and serves until SIGTERM or SIGINT
// (or until ronderun, its parent, dies).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--port") == 0)
      port = std::atoi(argv[i + 1]);
  }
  if (port <= 0 || port > 65535) {
    std::fprintf(stderr, "usage: ronde_store --port P (1..65535)\n");
    return 2;
  }
  // Gone with ronderun, however it ends.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() == 1)
    return 1;
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  // Blocked before the server's threads start, so that they inherit it
  // and the signal waits for sigwait() below.
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = true;
    options.numWorkers = std::nullopt;
    options.waitWorkers = false;
    const char* libuv = std::getenv("USE_LIBUV");
    options.useLibUV = libuv == nullptr || std::string(libuv) != "0";
    c10d::TCPStore store("127.0.0.1", options);
    std::printf("ready %d\n", static_cast<int>(store.getPort()));
    std::fflush(stdout);
    int signo = 0;
    sigwait(&stop, &signo);
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "ronde_store: cannot host the store on port %d: %s\n",
        port,
        e.what());
    return 1;
  }
  return 0;
}
