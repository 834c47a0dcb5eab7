#!/usr/bin/env bash
# A simulated cluster on one machine: N test hosts, each a network namespace
# with one interface (eth0, 198.18.0.<i+1>/24) on a shared bridge, so that
# ranks in different hosts see different host identities and talk over TCP
# between addresses that are not loopback. 198.18.0.0/15 is RFC 2544's
# benchmarking range: the bridge has no address and no route out, so no
# packet leaves the machine. Needs root and iproute2.
#
#   scripts/simcluster.sh check
#       exit 0 when a cluster can be made here, else print why and exit 77
#   scripts/simcluster.sh run [--hosts N] [--rate R] [--name NAME] -- CMD...
#       make the cluster, run CMD (in the root namespace) with SIMCLUSTER,
#       SIMCLUSTER_HOSTS and SIMCLUSTER_EXEC set, remove everything when CMD
#       ends, fails or is interrupted; exits with CMD's status
#   scripts/simcluster.sh up [--hosts N] [--rate R] [--name NAME]
#       make the cluster and print its name (remove it with `down`)
#   scripts/simcluster.sh exec NAME HOST CMD...
#       run CMD inside HOST (its index, its name h<i>, or its address)
#   scripts/simcluster.sh cut NAME HOST | mend NAME HOST
#       take HOST's link down (every packet to or from it is dropped, its
#       processes live on: a partitioned host), or bring it back up
#   scripts/simcluster.sh down NAME | --all
#       kill every process in the cluster's hosts and remove the cluster
#       (--all: every cluster this script made)
#
# --rate limits each host's link in both directions with a token bucket
# (tc tbf), e.g. 1gbit or 500mbit. --delay MS adds a one-way delay with
# netem where the kernel has it; where it does not, --delay fails and says
# so (tbf is in every kernel, netem is not).
#
# Inside host i, /etc/hosts (through ip netns' /etc/netns/<ns>/hosts) maps
# the host's own name h<i> to 127.0.1.1, as Debian and Ubuntu do, and the
# other hosts' names to their addresses.
set -euo pipefail

SELF=$(readlink -f "$0")
PREFIX=rsim
MARKS=/run/simcluster  # one empty file per cluster made

die() { echo "simcluster: $*" >&2; exit 2; }

ns_name() { echo "$1-$2"; }              # cluster, index
veth_root() { echo "$1v$2"; }            # the bridge side of host i's link
bridge_name() { echo "$1b"; }

cannot() {
  echo "simcluster: $*" >&2
  exit 77
}

check() {
  [ "$(id -u)" -eq 0 ] || cannot "needs root (network namespaces)"
  command -v ip >/dev/null || cannot "needs iproute2 (ip)"
  command -v tc >/dev/null || cannot "needs iproute2 (tc)"
  local probe="${PREFIX}probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    cannot "cannot create a network namespace here (ip netns add failed)"
  fi
  # Everything up() and exec need, tried once on a probe: a veth pair, a
  # bridge, a per-namespace /etc/hosts and running a command inside.
  local why=""
  if ! ip link add "${probe}a" type veth peer name "${probe}b" 2>/dev/null; then
    why="cannot create veth pairs here"
  elif ! ip link add "${probe}r" type bridge 2>/dev/null; then
    why="cannot create a bridge here"
  elif ! { mkdir -p "/etc/netns/$probe" && echo "127.0.1.1 probe" >"/etc/netns/$probe/hosts"; } 2>/dev/null; then
    why="cannot write /etc/netns (per-host /etc/hosts)"
  elif ! ip netns exec "$probe" grep -q probe /etc/hosts 2>/dev/null; then
    why="cannot run a command inside a network namespace (ip netns exec)"
  fi
  ip link del "${probe}a" 2>/dev/null || true
  ip link del "${probe}r" 2>/dev/null || true
  rm -rf "/etc/netns/$probe"
  ip netns del "$probe" 2>/dev/null || true
  [ -z "$why" ] || cannot "$why"
}

# The token bucket's burst: at least 64 KiB, and 1/100 s of traffic.
burst_for() {
  local rate=$1 num unit bits
  num=${rate%%[a-zA-Z]*}
  unit=${rate#"$num"}
  case "$unit" in
    gbit) bits=$((num * 1000000000)) ;;
    mbit) bits=$((num * 1000000)) ;;
    kbit) bits=$((num * 1000)) ;;
    bit|"") bits=$num ;;
    *) die "--rate: '$rate' is not a rate (e.g. 1gbit, 500mbit)" ;;
  esac
  [[ "$num" =~ ^[0-9]+$ ]] || die "--rate: '$rate' is not a rate (e.g. 1gbit, 500mbit)"
  local b=$((bits / 8 / 100))
  [ "$b" -ge 65536 ] || b=65536
  echo "$b"
}

netem_available() {
  local probe="${PREFIX}nq$$" ok=0
  ip netns add "$probe" 2>/dev/null || return 1
  ip -n "$probe" link set lo up
  tc -n "$probe" qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=1
  ip netns del "$probe" 2>/dev/null || true
  [ "$ok" -eq 1 ]
}

shape() {  # netns-or-empty dev rate delay_ms
  local ns=$1 dev=$2 rate=$3 delay=$4 tcx=(tc)
  [ -z "$ns" ] || tcx=(tc -n "$ns")
  if [ -n "$delay" ] && [ -n "$rate" ]; then
    "${tcx[@]}" qdisc add dev "$dev" root handle 1: netem delay "${delay}ms"
    "${tcx[@]}" qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" \
      burst "$(burst_for "$rate")" latency 50ms
  elif [ -n "$delay" ]; then
    "${tcx[@]}" qdisc add dev "$dev" root netem delay "${delay}ms"
  elif [ -n "$rate" ]; then
    "${tcx[@]}" qdisc add dev "$dev" root tbf rate "$rate" \
      burst "$(burst_for "$rate")" latency 50ms
  fi
}

down() {
  local name=$1 ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}-[0-9]+$" || true); do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  ip link del "$(bridge_name "$name")" 2>/dev/null || true
  rm -f "$MARKS/$name"
}

up() {
  local name=$1 hosts=$2 rate=$3 delay=$4
  [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "--hosts must be 1..200"
  if [ -n "$delay" ] && ! netem_available; then
    die "--delay needs the netem queueing discipline, which this kernel lacks (sch_netem); --rate works without it"
  fi
  [ -z "$rate" ] || burst_for "$rate" >/dev/null
  local br
  br=$(bridge_name "$name")
  ip link add "$br" type bridge
  ip link set "$br" up
  local i
  for ((i = 0; i < hosts; i++)); do
    local ns v
    ns=$(ns_name "$name" "$i")
    v=$(veth_root "$name" "$i")
    ip netns add "$ns"
    ip link add "$v" type veth peer name "${v}p"
    ip link set "${v}p" netns "$ns"
    ip -n "$ns" link set "${v}p" name eth0
    ip -n "$ns" addr add "198.18.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$v" master "$br"
    ip link set "$v" up
    shape "$ns" eth0 "$rate" "$delay"  # what the host sends
    shape "" "$v" "$rate" ""           # what the host receives
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      echo "127.0.1.1 h$i"
      local j
      for ((j = 0; j < hosts; j++)); do
        [ "$j" -eq "$i" ] || echo "198.18.0.$((j + 1)) h$j"
      done
    } >"/etc/netns/$ns/hosts"
  done
  # For down --all. Not under /etc/netns/<ns>/: ip netns exec bind-mounts
  # every file there over /etc.
  mkdir -p "$MARKS" && : >"$MARKS/$name"
}

host_index() {  # index, h<i> or 198.18.0.<i+1>
  case "$1" in
    198.18.0.*) echo $((${1##*.} - 1)) ;;
    h[0-9]*) echo "${1#h}" ;;
    [0-9]*) echo "$1" ;;
    *) die "unknown host '$1' (an index, h<i> or 198.18.0.<i+1>)" ;;
  esac
}

parse_common() {
  HOSTS=2 RATE="" DELAY="" NAME=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) HOSTS=$2; shift 2 ;;
      --rate) RATE=$2; shift 2 ;;
      --delay) DELAY=$2; shift 2 ;;
      --name) NAME=$2; shift 2 ;;
      --) shift; break ;;
      *) die "unknown option '$1'" ;;
    esac
  done
  REST=("$@")
  [ -n "$NAME" ] || NAME="${PREFIX}$(($$ % 100000))"
  [[ "$NAME" =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "--name must be 1-10 lowercase letters and digits"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  check) check ;;
  up)
    check
    parse_common "$@"
    trap 'down "$NAME"' ERR
    up "$NAME" "$HOSTS" "$RATE" "$DELAY"
    echo "$NAME"
    ;;
  cut|mend)
    [ $# -eq 2 ] || die "usage: simcluster.sh $cmd NAME HOST"
    state=down
    [ "$cmd" = cut ] || state=up
    ip link set "$(veth_root "$1" "$(host_index "$2")")" "$state"
    ;;
  down)
    [ $# -eq 1 ] || die "usage: simcluster.sh down NAME | --all"
    if [ "$1" = "--all" ]; then
      # Every cluster this script made: each host's /etc/netns entry names
      # its cluster.
      for n in $(ls "$MARKS" 2>/dev/null); do
        down "$n"
      done
    else
      down "$1"
    fi
    ;;
  exec)
    [ $# -ge 3 ] || die "usage: simcluster.sh exec NAME HOST CMD..."
    name=$1 i=$(host_index "$2")
    shift 2
    exec ip netns exec "$(ns_name "$name" "$i")" "$@"
    ;;
  run)
    check
    parse_common "$@"
    [ ${#REST[@]} -gt 0 ] || die "run needs a command after --"
    child=""
    # A signal ends the command (bash runs a trap only between commands, so
    # the command runs in the background and the script waits for it).
    stop() {
      [ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true
      exit "$1"
    }
    trap 'down "$NAME"' EXIT
    trap 'stop 130' INT
    trap 'stop 143' TERM
    trap 'stop 129' HUP
    up "$NAME" "$HOSTS" "$RATE" "$DELAY"
    addrs=""
    for ((i = 0; i < HOSTS; i++)); do addrs+="${addrs:+ }198.18.0.$((i + 1))"; done
    export SIMCLUSTER="$NAME" SIMCLUSTER_HOSTS="$addrs" \
      SIMCLUSTER_EXEC="$SELF exec $NAME"
    "${REST[@]}" <&0 &
    child=$!
    set +e
    wait "$child"
    rc=$?
    set -e
    child=""
    exit "$rc"
    ;;
  *)
    sed -n '2,33p' "$SELF" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
