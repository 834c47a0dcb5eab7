// ronderun's command line (see options.h). Each option's value is checked
// where it is read; the checks that need all of them run once at the end.
#include "options.h"

namespace ronde::detail {

const char kUsage[] =
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
    "  --min-np N           an elastic job (ronde::elastic::run): ronderun\n"
    "                       hosts the store, which outlives every rank, and\n"
    "                       a failed rank does not end the job; the others\n"
    "                       go on while at least N ranks are left\n"
    "                       (RONDE_ELASTIC_MIN_NP=N)\n"
    "  --max-np M           an elastic job grows to at most M ranks\n"
    "  --host-discovery-script S\n"
    "                       run S every second; it prints host:slots\n"
    "                       lines, and new ranks are started on free slots\n"
    "                       (up to --max-np); they join at the next commit\n"
    "  --restart-failed     start a replacement for a failed rank on its\n"
    "                       host after a second; a host that fails three\n"
    "                       times gets no more ranks\n"
    "  --bind-to core|socket|none\n"
    "                       the CPUs each rank runs on (RONDE_BIND_TO):\n"
    "                       core (default): its own share of the host's\n"
    "                       CPUs (their number over the host's ranks);\n"
    "                       socket: one socket's; none: any\n"
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
    "When a rank fails (and the job is not elastic), the others get\n"
    "SIGTERM and, after\n"
    "RONDE_KILL_GRACE_SECONDS (default 5), SIGKILL; ronderun then exits with\n"
    "the first failing rank's code (128 + signal if it was killed). A remote\n"
    "rank is the template's process (ssh): ending it ends the connection.\n";

namespace {

bool is_flag(const std::string& arg) {
  return arg == "-h" || arg == "--help" || arg == "--no-prefix" ||
         arg == "--verbose" || arg == "--restart-failed";
}

bool takes_value(const std::string& arg) {
  return arg == "-np" || arg == "-n" || arg == "--np" || arg == "--timeout" ||
         arg == "--min-np" || arg == "--max-np" ||
         arg == "--host-discovery-script" || arg == "--job-id" ||
         arg == "--port" || arg == "--host" || arg == "-H" ||
         arg == "--hosts" || arg == "--hostfile" || arg == "--rsh" ||
         arg == "-x" || arg == "--timeline" || arg == "--bind-to";
}

void set_flag(const std::string& arg, Options& options) {
  if (arg == "--no-prefix") {
    options.prefix = false;
  } else if (arg == "--verbose") {
    options.verbose = true;
  } else if (arg == "--restart-failed") {
    options.restart_failed = true;
  } else {
    options.help = true;
  }
}

// The options whose value is a number.
std::string set_number(
    const std::string& arg, const std::string& value, Options& options) {
  long number = 0;
  if (arg == "--timeout") {
    if (!parse_int(value, 1, 1000000000, number)) {
      return "--timeout expects a positive whole number of seconds, got '" +
             value + "'";
    }
    options.timeout_seconds = number;
  } else if (arg == "--min-np" || arg == "--max-np") {
    if (!parse_int(value, 1, 1000000, number)) {
      return arg + " expects a positive number of ranks, got '" + value + "'";
    }
    (arg == "--min-np" ? options.min_ranks : options.max_ranks) =
        static_cast<int>(number);
  } else if (arg == "--port") {
    if (!parse_int(value, 1, 65535, number)) {
      return "--port expects a port number in 1..65535, got '" + value + "'";
    }
    options.port = static_cast<int>(number);
  } else {
    if (!parse_int(value, 1, 1000000, number)) {
      return arg + " expects a positive number of ranks, got '" + value + "'";
    }
    options.num_ranks = static_cast<int>(number);
  }
  return "";
}

std::string set_hosts(
    const std::string& arg, const std::string& value, Options& options) {
  if (arg == "--hostfile") {
    return read_hostfile(value, options.hosts);
  }
  std::string error = parse_host_list(value, arg, options.hosts);
  if (error.empty() && options.hosts.empty()) {
    error = arg + " names no host";
  }
  return error;
}

// The options whose value is text that must not be empty.
std::string set_text(
    const std::string& arg, const std::string& value, Options& options) {
  if (arg == "-x") {
    if (value.empty() || value[0] == '=') {
      return "-x expects NAME or NAME=VALUE, got '" + value + "'";
    }
    options.exports.push_back(value);
    return "";
  }
  const bool empty = arg == "--rsh"
                         ? value.find_first_not_of(" \t") == std::string::npos
                         : value.empty();
  if (empty) {
    return arg + " must not be empty";
  }
  if (arg == "--bind-to") {
    if (value != "core" && value != "socket" && value != "none")
      return "--bind-to expects core, socket or none, got '" + value + "'";
    options.bind_to = value;
  } else if (arg == "--job-id") {
    options.job_id = value;
  } else if (arg == "--rsh") {
    options.rsh = value;
  } else if (arg == "--timeline") {
    options.timeline_dir = value;
  } else if (arg == "--host-discovery-script") {
    options.discovery_script = value;
  } else {
    options.host = value;
    options.host_given = true;
  }
  return "";
}

std::string set_value(
    const std::string& arg, const std::string& value, Options& options) {
  if (arg == "-np" || arg == "-n" || arg == "--np" || arg == "--timeout" ||
      arg == "--min-np" || arg == "--max-np" || arg == "--port") {
    return set_number(arg, value, options);
  }
  if (arg == "-H" || arg == "--hosts" || arg == "--hostfile") {
    return set_hosts(arg, value, options);
  }
  return set_text(arg, value, options);
}

// With hosts, -np defaults to all their slots and may not exceed them.
std::string check_rank_count(bool have_np, Options& options) {
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
  return "";
}

}  // namespace

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
    if (is_flag(arg)) {
      set_flag(arg, options);
      if (options.help) {
        return "";
      }
      continue;
    }
    if (!takes_value(arg)) {
      return "unknown option '" + arg + "'";
    }
    if (i + 1 >= argc) {
      return "option '" + arg + "' needs a value";
    }
    std::string error = set_value(arg, argv[++i], options);
    if (!error.empty()) {
      return error;
    }
    have_np = have_np || arg == "-np" || arg == "-n" || arg == "--np";
  }
  std::string error = check_rank_count(have_np, options);
  if (!error.empty()) {
    return error;
  }
  const bool grows = options.max_ranks > 0 ||
                     !options.discovery_script.empty() ||
                     options.restart_failed;
  if (grows && options.min_ranks == 0) {
    return "--max-np, --host-discovery-script and --restart-failed are for "
           "elastic jobs: give --min-np too";
  }
  if (!options.discovery_script.empty() && options.max_ranks == 0) {
    return "--host-discovery-script needs --max-np (how far the job may "
           "grow)";
  }
  if (options.max_ranks > 0 && options.max_ranks < options.num_ranks) {
    return "--max-np " + std::to_string(options.max_ranks) +
           " is fewer than the job's " + std::to_string(options.num_ranks) +
           " ranks";
  }
  if (options.min_ranks > options.num_ranks) {
    return "--min-np " + std::to_string(options.min_ranks) +
           " is more than the job's " + std::to_string(options.num_ranks) +
           " ranks";
  }
  if (i >= argc) {
    return "no command given";
  }
  options.command.assign(argv + i, argv + argc);
  return "";
}

}  // namespace ronde::detail
