// ronderun: starts the ranks of a training command with the RONDE_*
// rendezvous environment (N local ranks, or several hosts' ranks through a
// remote-command template such as ssh), tags their output by rank, and takes
// the whole job down as soon as one rank fails so that no rank is left
// waiting forever.

#include "runtime/net_address.h"
#include "timeline_merge.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace ronde {
namespace detail {

using Clock = std::chrono::steady_clock;

constexpr int kUsageExitCode = 2;
constexpr int kFailureExitCode = 1;
constexpr int kExecFailedExitCode = 127;
constexpr double kDefaultKillGraceSeconds = 5.0;
constexpr double kMaxKillGraceSeconds = 7.0 * 24 * 3600;
constexpr double kSignalKillSeconds = 10.0;
// How long output pipes may stay open once every rank has exited: only a
// background process left behind by a rank keeps them open that long.
constexpr double kDrainSeconds = 3.0;
// Bounds the reads done when a rank exits, so a background process that
// keeps writing cannot hold the supervisor in one place.
constexpr int kMaxDrainReads = 64;
constexpr size_t kReadChunk = 64 * 1024;
constexpr const char* kDefaultHost = "127.0.0.1";
constexpr const char* kGraceEnv = "RONDE_KILL_GRACE_SECONDS";
constexpr const char* kSecretFileEnv = "RONDE_JOB_SECRET_FILE";
// The largest secret ronderun hands on, as the ranks accept (runtime/auth).
constexpr size_t kMaxSecretBytes = 4096;

constexpr const char* kDefaultRsh = "ssh -o BatchMode=yes {host}";

constexpr const char kUsage[] =
    "usage: ronderun -np N [options] [--] CMD [ARGS...]\n"
    "       ronderun -H HOST:SLOTS[,HOST:SLOTS...] [options] [--] CMD...\n"
    "       ronderun --merge-timelines OUT FILE...\n"
    "\n"
    "Starts N ranks of CMD on this host, or the ranks of several hosts, with\n"
    "the RONDE_* environment set.\n"
    "\n"
    "options:\n"
    "  -np N, -n N, --np N  number of ranks to start (>= 1; with -H, at most\n"
    "                       the slots given, filled host by host; default:\n"
    "                       all of them)\n"
    "  -H, --hosts LIST     hosts and their slots: host0:2,host1:2\n"
    "  --hostfile FILE      one host per line: 'host slots=N' or 'host:N'\n"
    "                       ('#' starts a comment)\n"
    "  --rsh TEMPLATE       how a host's rank is started (default:\n"
    "                       'ssh -o BatchMode=yes {host}'); {host} is "
    "replaced\n"
    "                       and one shell command line is appended, so a\n"
    "                       local template ends with 'sh -c'\n"
    "  -x NAME[=VALUE]      also pass NAME to remote ranks (RONDE_*, GLOO_*,\n"
    "                       NCCL_*, OMP_*, PATH, LD_LIBRARY_PATH and\n"
    "                       PYTHONPATH always are)\n"
    "  --timeout S          export RONDE_TIMEOUT_SECONDS=S (seconds, >= 1)\n"
    "  --job-id ID          job id shared by all ranks (default: random)\n"
    "  --port P             rendezvous port (default: a free local port)\n"
    "  --host H             rendezvous address (default: 127.0.0.1; with -H,\n"
    "                       the first host's address as this host resolves\n"
    "                       it, or, when that is this host's loopback, this\n"
    "                       host's address on the route to the next host)\n"
    "  --timeline DIR       every rank writes its timeline to\n"
    "                       DIR/timeline.RANK.json (RONDE_TIMELINE); when the\n"
    "                       job ends they are merged into DIR/timeline.json,\n"
    "                       a track per rank (ui.perfetto.dev). Ranks on\n"
    "                       other hosts need DIR there too, and their files\n"
    "                       are merged when DIR is shared\n"
    "  --merge-timelines OUT FILE...\n"
    "                       merge timelines written by ranks of any launcher\n"
    "                       into OUT, and exit\n"
    "  --no-prefix          do not prefix output lines with \"[rank] \"\n"
    "  --verbose            print the job id, port and command to stderr\n"
    "  -h, --help           print this help and exit\n"
    "\n"
    "When a rank fails, the others get SIGTERM and, after\n"
    "RONDE_KILL_GRACE_SECONDS (default 5), SIGKILL; ronderun then exits with\n"
    "the first failing rank's code (128 + signal if it was killed). A remote\n"
    "rank is the template's process (ssh): ending it ends the connection.\n";

// Signals that ronderun forwards to the ranks. A signal that was ignored
// when ronderun started (nohup, `cmd &` in a script) stays ignored.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kNumForwardedSignals =
    sizeof(kForwardedSignals) / sizeof(kForwardedSignals[0]);

struct HostSlots {
  std::string host;
  int slots = 1;
};

struct Options {
  int num_ranks = 0;
  std::vector<HostSlots> hosts;  // empty: every rank on this host
  std::string rsh = kDefaultRsh;
  std::vector<std::string> exports;  // -x
  bool host_given = false;
  std::optional<long> timeout_seconds;
  std::string job_id;
  int port = 0;
  std::string host = kDefaultHost;
  std::string timeline_dir;  // --timeline
  bool prefix = true;
  bool verbose = false;
  bool help = false;
  std::vector<std::string> command;
};

// Accepts only plain decimal digits, so "-1", " 3" and "3x" are all refused
// with the same message instead of being half-parsed by strtol.
bool parse_int(const std::string& text, long min, long max, long& value) {
  if (text.empty() || text.size() > 18) {
    return false;
  }
  long result = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      return false;
    }
    result = result * 10 + (c - '0');
  }
  if (result < min || result > max) {
    return false;
  }
  value = result;
  return true;
}

// "host0:2,host1" -> hosts with slots (1 when not given).
std::string parse_host_list(
    const std::string& text, const std::string& what, Options& options) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) {
      comma = text.size();
    }
    std::string item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) {
      continue;
    }
    HostSlots h;
    // The slot count follows the last colon, unless the host is an IPv6
    // address in brackets: [fd00::1]:2.
    size_t colon = item.rfind(':');
    size_t bracket = item.rfind(']');
    if (colon != std::string::npos &&
        (bracket == std::string::npos || colon > bracket)) {
      long slots = 0;
      if (!parse_int(item.substr(colon + 1), 1, 1000000, slots)) {
        return what + ": '" + item + "' needs a positive slot count after ':'";
      }
      h.slots = static_cast<int>(slots);
      item = item.substr(0, colon);
    }
    if (item.size() > 2 && item.front() == '[' && item.back() == ']') {
      item = item.substr(1, item.size() - 2);
    }
    if (item.empty()) {
      return what + ": a host name is empty";
    }
    h.host = item;
    options.hosts.push_back(h);
  }
  return "";
}

std::string read_hostfile(const std::string& path, Options& options) {
  std::ifstream in(path);
  if (!in) {
    return "--hostfile: cannot read '" + path + "'";
  }
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && isspace(static_cast<unsigned char>(line[i]))) {
        ++i;
      }
      size_t j = i;
      while (j < line.size() && !isspace(static_cast<unsigned char>(line[j]))) {
        ++j;
      }
      if (j > i) {
        words.push_back(line.substr(i, j - i));
      }
      i = j;
    }
    if (words.empty()) {
      continue;
    }
    const std::string where = path + ":" + std::to_string(number);
    std::string spec = words[0];
    if (words.size() == 2 && words[1].rfind("slots=", 0) == 0) {
      spec += ":" + words[1].substr(6);
    } else if (words.size() != 1) {
      return where + ": expected 'host slots=N' or 'host:N'";
    }
    std::string error = parse_host_list(spec, where, options);
    if (!error.empty()) {
      return error;
    }
  }
  if (options.hosts.empty()) {
    return "--hostfile: '" + path + "' names no host";
  }
  return "";
}

// Returns an error message, or an empty string when the arguments are valid.
std::string parse_args(int argc, char** argv, Options& options) {
  bool have_np = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      break;
    }
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      return "";
    }
    if (arg == "--no-prefix") {
      options.prefix = false;
      continue;
    }
    if (arg == "--verbose") {
      options.verbose = true;
      continue;
    }
    const bool takes_value =
        arg == "-np" || arg == "-n" || arg == "--np" || arg == "--timeout" ||
        arg == "--job-id" || arg == "--port" || arg == "--host" ||
        arg == "-H" || arg == "--hosts" || arg == "--hostfile" ||
        arg == "--rsh" || arg == "-x" || arg == "--timeline";
    if (!takes_value) {
      return "unknown option '" + arg + "'";
    }
    if (i + 1 >= argc) {
      return "option '" + arg + "' needs a value";
    }
    const std::string value = argv[++i];
    long number = 0;
    if (arg == "-np" || arg == "-n" || arg == "--np") {
      if (!parse_int(value, 1, 1000000, number)) {
        return arg + " expects a positive number of ranks, got '" + value + "'";
      }
      options.num_ranks = static_cast<int>(number);
      have_np = true;
    } else if (arg == "--timeout") {
      if (!parse_int(value, 1, 1000000000, number)) {
        return "--timeout expects a positive whole number of seconds, got '" +
               value + "'";
      }
      options.timeout_seconds = number;
    } else if (arg == "--port") {
      if (!parse_int(value, 1, 65535, number)) {
        return "--port expects a port number in 1..65535, got '" + value + "'";
      }
      options.port = static_cast<int>(number);
    } else if (arg == "--job-id") {
      if (value.empty()) {
        return "--job-id must not be empty";
      }
      options.job_id = value;
    } else if (arg == "-H" || arg == "--hosts") {
      std::string error = parse_host_list(value, arg, options);
      if (!error.empty()) {
        return error;
      }
      if (options.hosts.empty()) {
        return arg + " names no host";
      }
    } else if (arg == "--hostfile") {
      std::string error = read_hostfile(value, options);
      if (!error.empty()) {
        return error;
      }
    } else if (arg == "--rsh") {
      if (value.find_first_not_of(" \t") == std::string::npos) {
        return "--rsh must not be empty";
      }
      options.rsh = value;
    } else if (arg == "--timeline") {
      if (value.empty()) {
        return "--timeline must not be empty";
      }
      options.timeline_dir = value;
    } else if (arg == "-x") {
      if (value.empty() || value[0] == '=') {
        return "-x expects NAME or NAME=VALUE, got '" + value + "'";
      }
      options.exports.push_back(value);
    } else {
      if (value.empty()) {
        return "--host must not be empty";
      }
      options.host = value;
      options.host_given = true;
    }
  }
  int slots = 0;
  for (const HostSlots& h : options.hosts) {
    slots += h.slots;
  }
  if (!options.hosts.empty()) {
    if (!have_np) {
      options.num_ranks = slots;
    } else if (options.num_ranks > slots) {
      return "-np " + std::to_string(options.num_ranks) + " asks for more " +
             "ranks than the hosts have slots (" + std::to_string(slots) + ")";
    }
  } else if (!have_np) {
    return "missing -np N (the number of ranks) or -H HOST:SLOTS,...";
  }
  if (i >= argc) {
    return "no command given";
  }
  options.command.assign(argv + i, argv + argc);
  return "";
}

std::string signal_name(int signo) {
  switch (signo) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return std::to_string(signo);
  }
}

// Quotes an argument for the --verbose command line only when needed, so the
// printed line can be pasted back into a shell.
std::string shell_quote(const std::string& arg) {
  const bool plain =
      !arg.empty() &&
      arg.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
          "-_./=:,+@%") == std::string::npos;
  if (plain) {
    return arg;
  }
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

bool set_fd_flags(int fd, bool nonblocking) {
  const int fd_flags = fcntl(fd, F_GETFD);
  if (fd_flags < 0 || fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC) < 0) {
    return false;
  }
  if (nonblocking) {
    const int fl_flags = fcntl(fd, F_GETFL);
    if (fl_flags < 0 || fcntl(fd, F_SETFL, fl_flags | O_NONBLOCK) < 0) {
      return false;
    }
  }
  return true;
}

void close_fd(int& fd) {
  if (fd >= 0) {
    // Retrying close after EINTR may close a reused descriptor on Linux.
    (void)close(fd);
    fd = -1;
  }
}

// Set by the signal handler, consumed by the poll loop. Only flags and a
// wake-up byte cross from the handler, which keeps it async-signal-safe.
volatile sig_atomic_t g_pending_signals[kNumForwardedSignals] = {};
int g_wake_fd = -1;

extern "C" void on_signal(int signo) {
  const int saved_errno = errno;
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    if (kForwardedSignals[i] == signo) {
      g_pending_signals[i] = 1;
    }
  }
  const char byte = 0;
  // The pipe is non-blocking: when it is full a wake-up is pending anyway.
  ssize_t ignored = write(g_wake_fd, &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

struct OutputStream {
  int fd = -1;          // read end of the rank's pipe; -1 once closed
  int sink = -1;        // ronderun's own stdout or stderr
  std::string pending;  // bytes after the last newline seen
};

struct Rank {
  int index = 0;
  // What to exec: the command itself, or the remote-command template's
  // words and the shell command line that starts the rank on its host.
  std::vector<std::string> argv;
  pid_t pid = -1;  // also the process group id
  bool running = false;
  std::string prefix;
  OutputStream out;
  OutputStream err;
};

// Hosts started without the remote-command template.
bool is_local_host(const std::string& host) {
  return host == "localhost" || is_loopback_address(host);
}

// The variables a remote rank gets: ronde's own, the communication
// libraries', the ones that find programs and libraries, and -x's.
std::vector<std::string> forwarded_names(const std::vector<std::string>& x) {
  std::vector<std::string> names = {
      "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV"};
  for (const std::string& e : x) {
    names.push_back(e.substr(0, e.find('=')));
  }
  return names;
}

bool forwarded(const std::string& name, const std::vector<std::string>& extra) {
  for (const char* prefix : {"RONDE_", "GLOO_", "NCCL_", "OMP_"}) {
    if (name.rfind(prefix, 0) == 0) {
      return true;
    }
  }
  return std::find(extra.begin(), extra.end(), name) != extra.end();
}

// The template's words with {host} replaced, then one shell command line:
// cd to this directory (when it exists there), then exec the command under
// the rank's variables.
std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (char c : text) {
    if (quote != 0) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (isspace(static_cast<unsigned char>(c))) {
      if (in_word) {
        words.push_back(word);
        word.clear();
        in_word = false;
      }
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) {
    words.push_back(word);
  }
  return words;
}

std::string replace_all(
    std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

class Launcher {
 public:
  explicit Launcher(Options options) : options_(std::move(options)) {}
  ~Launcher() {
    remove_secret();
  }

  int run();

 private:
  bool ensure_std_fds_open();
  bool install_signal_handlers();
  bool pick_free_port();
  void make_job_id();
  bool prepare_secret();
  void remove_secret();
  bool prepare_timeline_dir();
  std::string timeline_file(int rank) const;
  void merge_timeline();
  double read_kill_grace();
  bool choose_rendezvous_address();
  void build_environments();
  void start_ranks();
  bool start_rank(Rank& rank);
  [[noreturn]] void exec_rank(
      Rank& rank,
      int in_read,
      int out_write,
      int err_write,
      const sigset_t& original_mask);
  void supervise();
  void handle_deadlines();
  bool finished() const;
  bool any_running() const;
  int poll_timeout_ms() const;
  void drain_wake_pipe();
  void handle_pending_signals();
  void reap_children();
  void on_rank_exit(Rank& rank, int status);
  bool read_stream(Rank& rank, OutputStream& stream);
  void close_stream(Rank& rank, OutputStream& stream);
  void emit_lines(const Rank& rank, int sink, const char* data, size_t size);
  void stop_ranks(int signo, double seconds_until_kill);
  void signal_live_groups(int signo);
  void abort_job();
  void write_all(int fd, const char* data, size_t size);
  std::vector<std::string> remote_environment(
      const std::vector<std::string>& env) const;
  std::vector<std::string> remote_argv(
      const std::string& host,
      const std::vector<std::string>& env,
      const std::string& cwd) const;
  void message(const std::string& text);

  Options options_;
  std::vector<Rank> ranks_;
  std::vector<std::vector<std::string>> rank_env_;
  std::vector<std::vector<std::string>> rank_argv_;  // empty: the command
  double kill_grace_seconds_ = kDefaultKillGraceSeconds;
  int wake_read_fd_ = -1;
  int dev_null_fd_ = -1;
  // The job secret (docs/security.md): its bytes, for the ranks on other
  // hosts (written to their stdin), and the private file that holds it
  // here, when ronderun made it (removed at exit).
  std::string secret_;
  std::string secret_file_;
  std::string secret_dir_;
  pid_t parent_pid_ = -1;
  struct sigaction original_actions_[kNumForwardedSignals] = {};
  struct sigaction original_sigchld_ = {};
  struct sigaction original_sigpipe_ = {};
  bool sink_broken_[3] = {false, false, false};
  bool stopping_ = false;
  bool killed_ = false;
  int interrupted_by_ = 0;
  std::optional<int> first_failure_code_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> drain_deadline_;
};

Clock::duration seconds_to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(seconds));
}

void Launcher::write_all(int fd, const char* data, size_t size) {
  if (fd < 0 || fd > 2 || sink_broken_[fd]) {
    return;
  }
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Our stdout may share a non-blocking file description with the shell.
      struct pollfd pfd = {fd, POLLOUT, 0};
      if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
        sink_broken_[fd] = true;
        return;
      }
      continue;
    }
    // A reader that went away (`| head`, closed terminal) must not stop the
    // supervision of the ranks, so their output is dropped from now on.
    sink_broken_[fd] = true;
    return;
  }
}

void Launcher::message(const std::string& text) {
  const std::string line = "ronderun: " + text + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
}

// Closed standard descriptors would be reused for the pipes, and dup2 onto
// the same number in the child would then clobber one stream with another.
bool Launcher::ensure_std_fds_open() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) {
      continue;
    }
    int opened = -1;
    do {
      opened = open("/dev/null", O_RDWR);
    } while (opened < 0 && errno == EINTR);
    if (opened != fd) {
      return false;
    }
  }
  return true;
}

bool Launcher::install_signal_handlers() {
  int fds[2];
  if (pipe(fds) < 0) {
    message(std::string("cannot create a pipe: ") + strerror(errno));
    return false;
  }
  wake_read_fd_ = fds[0];
  g_wake_fd = fds[1];
  if (!set_fd_flags(fds[0], true) || !set_fd_flags(fds[1], true)) {
    message(std::string("cannot configure a pipe: ") + strerror(errno));
    return false;
  }

  struct sigaction action = {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    const int signo = kForwardedSignals[i];
    if (sigaction(signo, nullptr, &original_actions_[i]) < 0) {
      message(std::string("sigaction failed: ") + strerror(errno));
      return false;
    }
    if (original_actions_[i].sa_handler == SIG_IGN) {
      continue;
    }
    if (sigaction(signo, &action, nullptr) < 0) {
      message(std::string("sigaction failed: ") + strerror(errno));
      return false;
    }
  }

  struct sigaction child_action = action;
  child_action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &child_action, &original_sigchld_) < 0) {
    message(std::string("sigaction failed: ") + strerror(errno));
    return false;
  }

  // A write to a vanished reader must fail with EPIPE rather than kill the
  // supervisor; the ranks get the original disposition back before exec.
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  if (sigaction(SIGPIPE, &ignore, &original_sigpipe_) < 0) {
    message(std::string("sigaction failed: ") + strerror(errno));
    return false;
  }
  return true;
}

bool Launcher::pick_free_port() {
  const int sock = socket(AF_INET, SOCK_STREAM, 0);
  if (sock < 0) {
    message(std::string("cannot pick a free port: socket: ") + strerror(errno));
    return false;
  }
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  // Free on every interface, for a rank 0 on another host at least likely.
  addr.sin_addr.s_addr =
      htonl(options_.hosts.empty() ? INADDR_LOOPBACK : INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bool ok = bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
            getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (!ok) {
    message(std::string("cannot pick a free port: ") + strerror(errno));
  } else {
    options_.port = ntohs(addr.sin_port);
  }
  (void)close(sock);
  return ok && options_.port > 0;
}

namespace {

// `n` bytes from /dev/urandom; false when it cannot be read in full.
bool read_urandom(unsigned char* bytes, size_t n) {
  int fd = -1;
  do {
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    return false;
  }
  size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, bytes + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close_fd(fd);
  return got == n;
}

// Writes all `n` bytes; false on an error.
bool write_fully(int fd, const char* data, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) {
      continue;
    }
    if (w <= 0) {
      return false;
    }
    done += static_cast<size_t>(w);
  }
  return true;
}

std::string hex_text(const unsigned char* bytes, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xf];
  }
  return out;
}

}  // namespace

void Launcher::make_job_id() {
  unsigned char bytes[8] = {};
  const bool have_random = read_urandom(bytes, sizeof(bytes));
  if (!have_random) {
    // Only needs to differ between concurrent jobs on this host.
    unsigned long long mix = static_cast<unsigned long long>(
        std::chrono::system_clock::now().time_since_epoch().count());
    mix ^=
        static_cast<unsigned long long>(Clock::now().time_since_epoch().count())
        << 17;
    for (unsigned char& byte : bytes) {
      mix = mix * 6364136223846793005ULL + 1442695040888963407ULL;
      byte = static_cast<unsigned char>(mix >> 56);
    }
  }
  options_.job_id = "ronde-" + std::to_string(getpid()) + "-" +
                    hex_text(bytes, sizeof(bytes));
}

// The job's secret: the file RONDE_JOB_SECRET_FILE names, else a fresh
// 256-bit one in a private file that only this job's ranks are told of.
// Never on a command line or in the environment: only the file's path is.
bool Launcher::prepare_secret() {
  const char* given = getenv(kSecretFileEnv);
  if (given != nullptr && *given != '\0') {
    secret_file_ = given;
    // Read only to hand it to ranks on other hosts; the ranks here read
    // (and check) the file themselves.
    bool remote = false;
    for (const HostSlots& h : options_.hosts) {
      remote = remote || !is_local_host(h.host);
    }
    if (!remote) {
      return true;
    }
    int fd = -1;
    do {
      fd = open(given, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      message(
          std::string("cannot read ") + kSecretFileEnv + " '" + given +
          "': " + strerror(errno));
      return false;
    }
    // A secret is a few dozen bytes; more would not fit the pipe that
    // carries it to each remote rank (start_rank) without a reader.
    char buf[kMaxSecretBytes + 1];
    size_t got = 0;
    for (;;) {
      const ssize_t n = read(fd, buf + got, sizeof(buf) - got);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0 || (got += static_cast<size_t>(n)) == sizeof(buf)) {
        break;
      }
    }
    if (got > kMaxSecretBytes) {
      close_fd(fd);
      message(
          std::string(kSecretFileEnv) + " '" + given + "' is larger than " +
          std::to_string(kMaxSecretBytes) + " bytes: not a secret");
      return false;
    }
    secret_.assign(buf, got);
    close_fd(fd);
    return true;
  }
  unsigned char bytes[32] = {};
  if (!read_urandom(bytes, sizeof(bytes))) {
    message("cannot read /dev/urandom to make the job secret");
    return false;
  }
  secret_ = hex_text(bytes, sizeof(bytes)) + "\n";
  const char* tmp = getenv("TMPDIR");
  std::string dir_template =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
      "/ronderun-XXXXXX";
  std::vector<char> dir(dir_template.begin(), dir_template.end());
  dir.push_back('\0');
  if (mkdtemp(dir.data()) == nullptr) {  // mode 0700
    message(
        "cannot make a private directory for the job secret (" + dir_template +
        "): " + strerror(errno));
    return false;
  }
  secret_dir_ = dir.data();
  secret_file_ = secret_dir_ + "/secret";
  int fd = -1;
  do {
    fd = open(
        secret_file_.c_str(),
        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
        0600);
  } while (fd < 0 && errno == EINTR);
  bool ok = fd >= 0 && write_fully(fd, secret_.data(), secret_.size());
  if (fd >= 0) {
    ok = close(fd) == 0 && ok;
  }
  if (!ok) {
    message(
        "cannot write the job secret to " + secret_file_ + ": " +
        strerror(errno));
    remove_secret();
    return false;
  }
  return true;
}

void Launcher::remove_secret() {
  if (secret_dir_.empty()) {
    return;
  }
  (void)unlink(secret_file_.c_str());
  (void)rmdir(secret_dir_.c_str());
  secret_dir_.clear();
}

double Launcher::read_kill_grace() {
  const char* text = getenv(kGraceEnv);
  if (text == nullptr || *text == '\0') {
    return kDefaultKillGraceSeconds;
  }
  char* end = nullptr;
  errno = 0;
  const double value = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(value) ||
      value < 0) {
    message(
        std::string("ignoring ") + kGraceEnv + "='" + text + "'; using " +
        std::to_string(static_cast<int>(kDefaultKillGraceSeconds)) +
        " seconds");
    return kDefaultKillGraceSeconds;
  }
  return std::min(value, kMaxKillGraceSeconds);
}

std::vector<std::string> Launcher::remote_environment(
    const std::vector<std::string>& env) const {
  const std::vector<std::string> extra = forwarded_names(options_.exports);
  std::vector<std::string> out;
  for (const std::string& e : env) {
    if (forwarded(e.substr(0, e.find('=')), extra)) {
      out.push_back(e);
    }
  }
  return out;
}

std::vector<std::string> Launcher::remote_argv(
    const std::string& host,
    const std::vector<std::string>& env,
    const std::string& cwd) const {
  std::vector<std::string> argv;
  for (const std::string& w : split_words(options_.rsh)) {
    argv.push_back(replace_all(w, "{host}", host));
  }
  std::string line;
  if (!cwd.empty()) {
    line = "cd " + shell_quote(cwd) + " 2>/dev/null; ";
  }
  if (!secret_.empty()) {
    // The secret arrives on stdin (start_rank) into a private file that is
    // removed at once, kept open as fd 3: nothing of it stays on that
    // host's disk, whatever the rank does, and only the rank can read it.
    line += std::string(
                "umask 077; f=$(mktemp) && cat > \"$f\" && exec 3< \"$f\" "
                "&& rm -f \"$f\" || exit 1; export ") +
            kSecretFileEnv + "=/dev/fd/3; ";
  }
  line += "exec env";
  for (const std::string& e : env) {
    line += " " + shell_quote(e);
  }
  for (const std::string& arg : options_.command) {
    line += " " + shell_quote(arg);
  }
  argv.push_back(line);
  return argv;
}

namespace {

// The numeric address `host` resolves to here (IPv4 first); empty when it
// does not resolve.
std::string resolve_numeric(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) {
    return "";
  }
  std::string v4;
  std::string v6;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a->ai_family == AF_INET && v4.empty()) {
      inet_ntop(
          AF_INET,
          &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr,
          buf,
          sizeof(buf));
      v4 = buf;
    } else if (a->ai_family == AF_INET6 && v6.empty()) {
      inet_ntop(
          AF_INET6,
          &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr,
          buf,
          sizeof(buf));
      v6 = buf;
    }
  }
  freeaddrinfo(res);
  return v4.empty() ? v6 : v4;
}

}  // namespace

// Rank 0 hosts the store on the first host: its address as this machine
// resolves it (ssh reaches it by the same name), unless that is loopback,
// in which case the first host is this machine and the address is the one
// this machine sends from on the route to the other hosts.
bool Launcher::choose_rendezvous_address() {
  if (options_.host_given || options_.hosts.empty()) {
    return true;
  }
  const std::string& first = options_.hosts.front().host;
  const std::string resolved = resolve_numeric(first);
  if (!resolved.empty() && !is_loopback_address(resolved)) {
    options_.host = resolved;
    return true;
  }
  if (resolved.empty()) {
    message(
        "cannot resolve the first host '" + first +
        "' (rank 0 hosts the rendezvous there); pass --host with an "
        "address of it that every host can reach");
    return false;
  }
  bool remote = false;
  for (const HostSlots& h : options_.hosts) {
    if (resolve_numeric(h.host) == resolved || is_local_host(h.host)) {
      continue;
    }
    remote = true;
    std::string source = route_source_address(h.host, options_.port);
    if (!source.empty() && !is_loopback_address(source)) {
      options_.host = source;
      return true;
    }
  }
  if (!remote) {
    options_.host = kDefaultHost;  // every rank on this machine
    return true;
  }
  message(
      "the first host '" + first + "' resolves to " + resolved +
      " (loopback) and no route to the other hosts shows this machine's "
      "address; pass --host with an address of it that every host reaches");
  return false;
}

void Launcher::build_environments() {
  const char* const kOwnNames[] = {
      "RONDE_RANK",
      "RONDE_SIZE",
      "RONDE_LOCAL_RANK",
      "RONDE_LOCAL_SIZE",
      "RONDE_CROSS_RANK",
      "RONDE_CROSS_SIZE",
      "RONDE_RENDEZVOUS_ADDR",
      "RONDE_RENDEZVOUS_PORT",
      "RONDE_JOB_ID",
      "RONDE_TIMEOUT_SECONDS",
      kSecretFileEnv,
      // Replaced by --timeline's path, else inherited.
      options_.timeline_dir.empty() ? "" : "RONDE_TIMELINE",
  };
  std::vector<std::string> base;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    bool ours = false;
    for (const char* own : kOwnNames) {
      ours = ours || name == own;
    }
    // An inherited timeout is kept unless --timeout replaces it; the other
    // variables always describe this job, never an enclosing one.
    if (name == "RONDE_TIMEOUT_SECONDS" && !options_.timeout_seconds) {
      ours = false;
    }
    if (!ours) {
      base.push_back(text);
    }
  }
  for (const std::string& x : options_.exports) {
    if (x.find('=') != std::string::npos) {
      base.push_back(x);
    }
  }
  // Ranks fill the hosts in order; a host with no slots left over keeps
  // its ranks' local and cross places as Horovod defines them.
  std::vector<HostSlots> hosts = options_.hosts;
  if (hosts.empty()) {
    hosts.push_back({"", options_.num_ranks});
  }
  std::vector<int> host_of;
  std::vector<int> used(hosts.size(), 0);
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (int k = 0; k < hosts[h].slots &&
         static_cast<int>(host_of.size()) < options_.num_ranks;
         ++k) {
      host_of.push_back(static_cast<int>(h));
      ++used[h];
    }
  }
  char cwd[4096] = {0};
  const bool have_cwd = getcwd(cwd, sizeof(cwd) - 1) != nullptr;
  const std::string size = std::to_string(options_.num_ranks);
  std::vector<int> next_local(hosts.size(), 0);
  rank_argv_.resize(static_cast<size_t>(options_.num_ranks));
  for (int r = 0; r < options_.num_ranks; ++r) {
    const int h = host_of[static_cast<size_t>(r)];
    const int local = next_local[static_cast<size_t>(h)]++;
    int cross_rank = 0;
    int cross_size = 0;
    for (size_t g = 0; g < hosts.size(); ++g) {
      if (used[g] > local) {
        cross_rank += static_cast<int>(g) < h ? 1 : 0;
        ++cross_size;
      }
    }
    const std::string& host = hosts[static_cast<size_t>(h)].host;
    std::vector<std::string> own;
    own.push_back("RONDE_RANK=" + std::to_string(r));
    own.push_back("RONDE_SIZE=" + size);
    own.push_back("RONDE_LOCAL_RANK=" + std::to_string(local));
    own.push_back("RONDE_LOCAL_SIZE=" + std::to_string(used[h]));
    own.push_back("RONDE_CROSS_RANK=" + std::to_string(cross_rank));
    own.push_back("RONDE_CROSS_SIZE=" + std::to_string(cross_size));
    own.push_back("RONDE_RENDEZVOUS_ADDR=" + options_.host);
    own.push_back("RONDE_RENDEZVOUS_PORT=" + std::to_string(options_.port));
    own.push_back("RONDE_JOB_ID=" + options_.job_id);
    if (!secret_file_.empty() && (host.empty() || is_local_host(host))) {
      own.push_back(std::string(kSecretFileEnv) + "=" + secret_file_);
    }
    if (options_.timeout_seconds) {
      own.push_back(
          "RONDE_TIMEOUT_SECONDS=" + std::to_string(*options_.timeout_seconds));
    }
    if (!options_.timeline_dir.empty()) {
      // Each rank puts its rank in place of {rank}.
      own.push_back(
          "RONDE_TIMELINE=" + options_.timeline_dir + "/timeline.{rank}.json");
    }
    std::vector<std::string> env = base;
    env.insert(env.end(), own.begin(), own.end());
    if (!host.empty() && !is_local_host(host)) {
      rank_argv_[static_cast<size_t>(r)] =
          remote_argv(host, remote_environment(env), have_cwd ? cwd : "");
    }
    rank_env_.push_back(std::move(env));
  }
}

bool Launcher::prepare_timeline_dir() {
  const std::string& dir = options_.timeline_dir;
  if (dir.empty()) {
    return true;
  }
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    message("--timeline: cannot create '" + dir + "': " + strerror(errno));
    return false;
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    message("--timeline: '" + dir + "' is not a directory");
    return false;
  }
  // A previous job's files would be merged as this one's.
  for (int r = 0; r < options_.num_ranks; ++r) {
    unlink(timeline_file(r).c_str());
  }
  return true;
}

std::string Launcher::timeline_file(int rank) const {
  return options_.timeline_dir + "/timeline." + std::to_string(rank) + ".json";
}

void Launcher::merge_timeline() {
  if (options_.timeline_dir.empty()) {
    return;
  }
  std::vector<std::string> files;
  std::string missing;
  for (int r = 0; r < options_.num_ranks; ++r) {
    if (access(timeline_file(r).c_str(), R_OK) == 0) {
      files.push_back(timeline_file(r));
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  if (files.empty()) {
    message(
        "--timeline: no rank wrote a timeline in '" + options_.timeline_dir +
        "'");
    return;
  }
  const std::string out = options_.timeline_dir + "/timeline.json";
  const TimelineMerge m = merge_timelines(files, out);
  if (!m.error.empty()) {
    message("--timeline: " + m.error);
    return;
  }
  std::string note = "timeline of " + std::to_string(m.files) + " rank(s) in " +
                     out + " (" + std::to_string(m.events) + " events)";
  if (!missing.empty()) {
    note += "; no file from rank(s) " + missing +
            " (another host's, or a rank that never started its timeline)";
  }
  for (const std::string& t : m.torn) {
    note += "; " + t + " ends mid-event, its complete events are kept";
  }
  message(note);
}

// ronderun --merge-timelines OUT FILE...
int merge_timelines_command(int argc, char** argv) {
  if (argc < 4) {
    fprintf(
        stderr,
        "ronderun: --merge-timelines needs OUT and at least one "
        "FILE\n%s",
        kUsage);
    return kUsageExitCode;
  }
  std::vector<std::string> inputs(argv + 3, argv + argc);
  const TimelineMerge m = merge_timelines(inputs, argv[2]);
  for (const std::string& u : m.unreadable) {
    fprintf(stderr, "ronderun: cannot read %s\n", u.c_str());
  }
  for (const std::string& t : m.torn) {
    fprintf(
        stderr,
        "ronderun: %s ends mid-event; its complete events are kept\n",
        t.c_str());
  }
  if (!m.error.empty()) {
    fprintf(stderr, "ronderun: %s\n", m.error.c_str());
    return kFailureExitCode;
  }
  fprintf(
      stderr,
      "ronderun: %d timeline(s), %lld events in %s\n",
      m.files,
      m.events,
      argv[2]);
  return m.unreadable.empty() ? 0 : kFailureExitCode;
}

int Launcher::run() {
  parent_pid_ = getpid();
  if (!ensure_std_fds_open()) {
    return kFailureExitCode;
  }
  if (!install_signal_handlers()) {
    return kFailureExitCode;
  }
  do {
    dev_null_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  } while (dev_null_fd_ < 0 && errno == EINTR);
  if (dev_null_fd_ < 0) {
    message(std::string("cannot open /dev/null: ") + strerror(errno));
    return kFailureExitCode;
  }
  if (options_.port == 0 && !pick_free_port()) {
    return kFailureExitCode;
  }
  if (!choose_rendezvous_address()) {
    return kFailureExitCode;
  }
  if (options_.job_id.empty()) {
    make_job_id();
  }
  kill_grace_seconds_ = read_kill_grace();
  if (!prepare_timeline_dir()) {
    return kFailureExitCode;
  }
  if (!prepare_secret()) {
    return kFailureExitCode;
  }
  build_environments();

  if (options_.verbose) {
    std::string command;
    for (const std::string& arg : options_.command) {
      command += (command.empty() ? "" : " ") + shell_quote(arg);
    }
    std::string hosts;
    for (const HostSlots& h : options_.hosts) {
      hosts += (hosts.empty() ? " on " : ",") + h.host + ":" +
               std::to_string(h.slots);
    }
    message(
        "job id " + options_.job_id + ", rendezvous " + options_.host + ":" +
        std::to_string(options_.port) + ", " +
        std::to_string(options_.num_ranks) + " rank(s)" + hosts + ": " +
        command);
  }

  start_ranks();
  supervise();
  remove_secret();
  merge_timeline();

  if (first_failure_code_) {
    return *first_failure_code_;
  }
  if (interrupted_by_ != 0) {
    return 128 + interrupted_by_;
  }
  return 0;
}

void Launcher::start_ranks() {
  ranks_.resize(static_cast<size_t>(options_.num_ranks));
  for (int r = 0; r < options_.num_ranks; ++r) {
    Rank& rank = ranks_[static_cast<size_t>(r)];
    rank.index = r;
    rank.prefix = "[" + std::to_string(r) + "] ";
    rank.out.sink = STDOUT_FILENO;
    rank.err.sink = STDERR_FILENO;
  }
  for (Rank& rank : ranks_) {
    bool interrupted = false;
    for (int i = 0; i < kNumForwardedSignals; ++i) {
      interrupted = interrupted || g_pending_signals[i] != 0;
    }
    // Starting more ranks would only give the poll loop more to stop.
    if (interrupted) {
      break;
    }
    if (!start_rank(rank)) {
      first_failure_code_ = kFailureExitCode;
      stop_ranks(SIGTERM, kill_grace_seconds_);
      break;
    }
  }
}

bool Launcher::start_rank(Rank& rank) {
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  if (pipe(out_pipe) < 0) {
    message(std::string("cannot create a pipe: ") + strerror(errno));
    return false;
  }
  if (pipe(err_pipe) < 0) {
    message(std::string("cannot create a pipe: ") + strerror(errno));
    close_fd(out_pipe[0]);
    close_fd(out_pipe[1]);
    return false;
  }
  // Every pipe end is close-on-exec so that no rank inherits another rank's
  // write end, which would keep that pipe from ever reaching EOF.
  bool ok =
      set_fd_flags(out_pipe[0], true) && set_fd_flags(err_pipe[0], true) &&
      set_fd_flags(out_pipe[1], false) && set_fd_flags(err_pipe[1], false);
  if (!ok) {
    message(std::string("cannot configure a pipe: ") + strerror(errno));
  }
  // A rank on another host gets the job secret on its stdin (remote_argv).
  int secret_pipe[2] = {-1, -1};
  if (ok && !secret_.empty() &&
      !rank_argv_[static_cast<size_t>(rank.index)].empty()) {
    ok = pipe(secret_pipe) == 0 && set_fd_flags(secret_pipe[0], false) &&
         set_fd_flags(secret_pipe[1], false);
    if (!ok) {
      message(std::string("cannot create a pipe: ") + strerror(errno));
    }
  }

  // Blocking the handled signals across fork keeps the child from running
  // our handler (and swallowing a forwarded signal) before it execs.
  sigset_t blocked;
  sigset_t original_mask;
  sigemptyset(&blocked);
  for (int signo : kForwardedSignals) {
    sigaddset(&blocked, signo);
  }
  sigaddset(&blocked, SIGCHLD);
  pid_t pid = -1;
  if (ok) {
    if (sigprocmask(SIG_BLOCK, &blocked, &original_mask) < 0) {
      message(std::string("sigprocmask failed: ") + strerror(errno));
      ok = false;
    }
  }
  if (ok) {
    pid = fork();
    if (pid == 0) {
      close_fd(out_pipe[0]);
      close_fd(err_pipe[0]);
      exec_rank(rank, secret_pipe[0], out_pipe[1], err_pipe[1], original_mask);
    }
    const int fork_errno = errno;
    if (sigprocmask(SIG_SETMASK, &original_mask, nullptr) < 0) {
      message(std::string("sigprocmask failed: ") + strerror(errno));
    }
    if (pid < 0) {
      message(std::string("cannot fork: ") + strerror(fork_errno));
      ok = false;
    }
  }
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  close_fd(secret_pipe[0]);
  if (ok && secret_pipe[1] >= 0) {
    // At most kMaxSecretBytes: the pipe holds them without a reader. A
    // short write leaves the rank a wrong secret, which it is refused for.
    (void)write_fully(secret_pipe[1], secret_.data(), secret_.size());
  }
  close_fd(secret_pipe[1]);
  if (!ok) {
    close_fd(out_pipe[0]);
    close_fd(err_pipe[0]);
    return false;
  }
  // Also done here so the group exists before we might signal it; EACCES
  // means the child already exec'd, after its own setpgid.
  if (setpgid(pid, pid) < 0 && errno != EACCES && errno != ESRCH) {
    message(
        "rank " + std::to_string(rank.index) +
        ": setpgid failed: " + strerror(errno));
  }
  rank.pid = pid;
  rank.running = true;
  rank.out.fd = out_pipe[0];
  rank.err.fd = err_pipe[0];
  return true;
}

void Launcher::exec_rank(
    Rank& rank,
    int in_read,
    int out_write,
    int err_write,
    const sigset_t& original_mask) {
  // Its own group keeps a terminal Ctrl-C from reaching the rank twice, and
  // lets one kill(-pgid) take down whatever the rank has spawned.
  (void)setpgid(0, 0);
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    (void)sigaction(kForwardedSignals[i], &original_actions_[i], nullptr);
  }
  (void)sigaction(SIGCHLD, &original_sigchld_, nullptr);
  (void)sigaction(SIGPIPE, &original_sigpipe_, nullptr);
  (void)sigprocmask(SIG_SETMASK, &original_mask, nullptr);
#ifdef __linux__
  // If ronderun itself is SIGKILLed the ranks must not live on unsupervised.
  (void)prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent_pid_) {
    _exit(kFailureExitCode);
  }
#endif
  // A rank in a background process group that read the terminal would be
  // stopped by SIGTTIN, so the ranks get no stdin; one on another host
  // reads the job secret from it, then its end.
  if (dup2(in_read >= 0 ? in_read : dev_null_fd_, STDIN_FILENO) < 0 ||
      dup2(out_write, STDOUT_FILENO) < 0 ||
      dup2(err_write, STDERR_FILENO) < 0) {
    _exit(kExecFailedExitCode);
  }
  std::vector<std::string>& words =
      rank_argv_[static_cast<size_t>(rank.index)].empty()
      ? options_.command
      : rank_argv_[static_cast<size_t>(rank.index)];
  std::vector<char*> argv;
  for (std::string& arg : words) {
    argv.push_back(&arg[0]);
  }
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& entry : rank_env_[static_cast<size_t>(rank.index)]) {
    envp.push_back(&entry[0]);
  }
  envp.push_back(nullptr);
  // execvp searches PATH from environ, which is now the rank's environment.
  environ = envp.data();
  execvp(argv[0], argv.data());
  const int exec_errno = errno;
  const std::string text = "ronderun: cannot run '" + words[0] +
                           "': " + strerror(exec_errno) + "\n";
  const char* data = text.data();
  size_t size = text.size();
  while (size > 0) {
    const ssize_t n = write(STDERR_FILENO, data, size);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  _exit(kExecFailedExitCode);
}

bool Launcher::any_running() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& rank) {
    return rank.running;
  });
}

bool Launcher::finished() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& rank) {
    return !rank.running && rank.out.fd < 0 && rank.err.fd < 0;
  });
}

int Launcher::poll_timeout_ms() const {
  std::optional<Clock::time_point> next;
  for (const auto& deadline : {kill_deadline_, drain_deadline_}) {
    if (deadline && (!next || *deadline < *next)) {
      next = deadline;
    }
  }
  if (!next) {
    return -1;
  }
  const auto left = *next - Clock::now();
  if (left <= Clock::duration::zero()) {
    return 0;
  }
  // Rounded up so that we never wake just before the deadline and spin.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, 24LL * 3600 * 1000));
}

void Launcher::signal_live_groups(int signo) {
  for (Rank& rank : ranks_) {
    const bool live = rank.running || rank.out.fd >= 0 || rank.err.fd >= 0;
    if (rank.pid <= 0 || !live) {
      continue;
    }
    if (kill(-rank.pid, signo) < 0 && errno == ESRCH && rank.running) {
      // The rank moved itself to another group; still reach the rank.
      (void)kill(rank.pid, signo);
    }
  }
}

void Launcher::stop_ranks(int signo, double seconds_until_kill) {
  stopping_ = true;
  signal_live_groups(signo);
  if (killed_) {
    return;
  }
  const auto deadline = Clock::now() + seconds_to_duration(seconds_until_kill);
  if (!kill_deadline_ || deadline < *kill_deadline_) {
    kill_deadline_ = deadline;
  }
}

void Launcher::handle_deadlines() {
  const auto now = Clock::now();
  if (kill_deadline_ && now >= *kill_deadline_) {
    kill_deadline_.reset();
    killed_ = true;
    if (any_running()) {
      message("ranks still running after the grace period; killing them");
    }
    signal_live_groups(SIGKILL);
  }
  if (!any_running() && !finished() && !drain_deadline_) {
    drain_deadline_ = now + seconds_to_duration(kDrainSeconds);
  }
  if (drain_deadline_ && now >= *drain_deadline_) {
    drain_deadline_.reset();
    for (Rank& rank : ranks_) {
      if (rank.out.fd < 0 && rank.err.fd < 0) {
        continue;
      }
      message(
          "rank " + std::to_string(rank.index) +
          " exited but left processes that hold its output open; no longer "
          "forwarding it");
      // The job is being torn down anyway, so nothing may outlive it.
      if (stopping_ && rank.pid > 0) {
        (void)kill(-rank.pid, SIGKILL);
      }
      close_stream(rank, rank.out);
      close_stream(rank, rank.err);
    }
  }
}

void Launcher::drain_wake_pipe() {
  char buffer[256];
  while (true) {
    const ssize_t n = read(wake_read_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    break;
  }
}

void Launcher::handle_pending_signals() {
  for (int i = 0; i < kNumForwardedSignals; ++i) {
    if (g_pending_signals[i] == 0) {
      continue;
    }
    g_pending_signals[i] = 0;
    const int signo = kForwardedSignals[i];
    if (interrupted_by_ == 0) {
      interrupted_by_ = signo;
    }
    message("got " + signal_name(signo) + "; forwarding it to the ranks");
    stop_ranks(signo, kSignalKillSeconds);
  }
}

void Launcher::reap_children() {
  while (true) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) {
      continue;
    }
    if (pid <= 0) {
      return;
    }
    for (Rank& rank : ranks_) {
      if (rank.pid == pid && rank.running) {
        on_rank_exit(rank, status);
        break;
      }
    }
  }
}

void Launcher::on_rank_exit(Rank& rank, int status) {
  rank.running = false;
  // Forward what the rank wrote before it died ahead of our verdict on it,
  // so its last error message reads before "rank R exited".
  for (OutputStream* stream : {&rank.out, &rank.err}) {
    for (int i = 0; i < kMaxDrainReads && stream->fd >= 0; ++i) {
      if (!read_stream(rank, *stream)) {
        break;
      }
    }
  }

  int code = 0;
  std::string how;
  if (WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    how = "exited with code " + std::to_string(code);
  } else if (WIFSIGNALED(status)) {
    code = 128 + WTERMSIG(status);
    how = "was killed by signal " + signal_name(WTERMSIG(status));
  } else {
    code = kFailureExitCode;
    how = "ended with wait status " + std::to_string(status);
  }
  const std::string who = "rank " + std::to_string(rank.index) + " ";
  if (code == 0 || first_failure_code_) {
    if (options_.verbose) {
      message(who + how);
    }
    return;
  }
  first_failure_code_ = code;
  // After a forwarded signal the ranks are already shutting down; a SIGTERM
  // on top would cut short their handling of the user's signal.
  if (stopping_) {
    message(who + how);
    return;
  }
  message(who + how + (any_running() ? "; stopping the other ranks" : ""));
  // Also reaches processes this rank left behind holding its output open.
  stop_ranks(SIGTERM, kill_grace_seconds_);
}

// Reads one chunk; returns true when data arrived and more may follow.
bool Launcher::read_stream(Rank& rank, OutputStream& stream) {
  char buffer[kReadChunk];
  const ssize_t n = read(stream.fd, buffer, sizeof(buffer));
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
      return errno == EINTR;
    }
    message(
        "rank " + std::to_string(rank.index) +
        ": reading output failed: " + strerror(errno));
    close_stream(rank, stream);
    return false;
  }
  if (n == 0) {
    close_stream(rank, stream);
    return false;
  }
  const size_t scanned = stream.pending.size();
  stream.pending.append(buffer, static_cast<size_t>(n));
  // Only the new bytes can hold a newline; rescanning a long pending line on
  // every chunk would make very long lines quadratic.
  size_t end = 0;
  for (size_t i = stream.pending.size(); i > scanned; --i) {
    if (stream.pending[i - 1] == '\n') {
      end = i;
      break;
    }
  }
  if (end > 0) {
    emit_lines(rank, stream.sink, stream.pending.data(), end);
    stream.pending.erase(0, end);
  }
  return true;
}

void Launcher::close_stream(Rank& rank, OutputStream& stream) {
  if (stream.fd < 0) {
    return;
  }
  close_fd(stream.fd);
  if (!stream.pending.empty()) {
    stream.pending += '\n';
    emit_lines(rank, stream.sink, stream.pending.data(), stream.pending.size());
    stream.pending.clear();
    stream.pending.shrink_to_fit();
  }
}

// Writes complete lines only, each in the same write() as its prefix, so
// lines of different ranks can never interleave.
void Launcher::emit_lines(
    const Rank& rank, int sink, const char* data, size_t size) {
  if (!options_.prefix) {
    write_all(sink, data, size);
    return;
  }
  std::string text;
  text.reserve(size + rank.prefix.size() * 4);
  size_t start = 0;
  while (start < size) {
    const void* found = memchr(data + start, '\n', size - start);
    const size_t end =
        found == nullptr
            ? size
            : static_cast<size_t>(static_cast<const char*>(found) - data) + 1;
    text += rank.prefix;
    text.append(data + start, end - start);
    start = end;
  }
  write_all(sink, text.data(), text.size());
}

// Used only when poll itself fails: nothing can be supervised any more, so
// the job is killed outright and every child reaped before we exit.
void Launcher::abort_job() {
  message("giving up on the job; killing all ranks");
  signal_live_groups(SIGKILL);
  for (Rank& rank : ranks_) {
    while (rank.running) {
      int status = 0;
      const pid_t pid = waitpid(rank.pid, &status, 0);
      if (pid < 0 && errno == EINTR) {
        continue;
      }
      rank.running = false;
    }
    close_fd(rank.out.fd);
    close_fd(rank.err.fd);
  }
  if (!first_failure_code_) {
    first_failure_code_ = kFailureExitCode;
  }
}

void Launcher::supervise() {
  std::vector<struct pollfd> fds;
  std::vector<std::pair<Rank*, OutputStream*>> streams;
  while (true) {
    handle_deadlines();
    if (finished()) {
      return;
    }
    fds.clear();
    streams.clear();
    fds.push_back({wake_read_fd_, POLLIN, 0});
    streams.emplace_back(nullptr, nullptr);
    for (Rank& rank : ranks_) {
      for (OutputStream* stream : {&rank.out, &rank.err}) {
        if (stream->fd >= 0) {
          fds.push_back({stream->fd, POLLIN, 0});
          streams.emplace_back(&rank, stream);
        }
      }
    }
    const int ready = poll(fds.data(), fds.size(), poll_timeout_ms());
    if (ready < 0 && errno != EINTR) {
      message(std::string("poll failed: ") + strerror(errno));
      abort_job();
      return;
    }
    if (ready > 0 && fds[0].revents != 0) {
      drain_wake_pipe();
    }
    handle_pending_signals();
    // Reaping before reading lets on_rank_exit drain a dead rank's output
    // in order; a SIGCHLD lost to coalescing is covered by reaping always.
    reap_children();
    if (ready <= 0) {
      continue;
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      OutputStream* stream = streams[i].second;
      if (fds[i].revents == 0 || stream->fd != fds[i].fd) {
        continue;
      }
      if (fds[i].revents & POLLNVAL) {
        close_stream(*streams[i].first, *stream);
        continue;
      }
      (void)read_stream(*streams[i].first, *stream);
    }
  }
}

}  // namespace detail
}  // namespace ronde

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--merge-timelines") == 0) {
    return ronde::detail::merge_timelines_command(argc, argv);
  }
  ronde::detail::Options options;
  const std::string error = ronde::detail::parse_args(argc, argv, options);
  if (options.help) {
    fputs(ronde::detail::kUsage, stdout);
    return fflush(stdout) == 0 ? 0 : ronde::detail::kFailureExitCode;
  }
  if (!error.empty()) {
    fprintf(stderr, "ronderun: %s\n%s", error.c_str(), ronde::detail::kUsage);
    return ronde::detail::kUsageExitCode;
  }
  ronde::detail::Launcher launcher(std::move(options));
  return launcher.run();
}
