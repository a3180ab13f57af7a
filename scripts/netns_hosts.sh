#!/usr/bin/env bash
# Two "machines" on one host for the MPI tests and benchmarks (issue 40): two network namespaces, each with
# its own loopback and one end of a veth pair, so that ranks in them can reach each other only by TCP across
# the veth, as ranks on two machines do across their network. Needs root (ip netns).
#
#   scripts/netns_hosts.sh up        creates them, unless they are up and answer (so concurrent test sessions
#                                    share them; none removes them under another):
#                                      machine a: namespace inferd-a, 10.77.0.1/24 on the cluster link
#                                      machine b: namespace inferd-b, 10.77.0.2/24 on the cluster link
#                                      and a second link from this host (10.77.1.254) to machine a
#                                      (10.77.1.1): the way a client reaches the server on rank 0
#   scripts/netns_hosts.sh down      removes them
#   scripts/netns_hosts.sh check     exits 0 when they are up and answer
#   scripts/netns_hosts.sh mpirun ARGS...
#                                    mpirun ARGS with one rank a machine (a, then b): mpirun runs on machine a,
#                                    starts machine b's daemon through `rsh` below, and the ranks talk by TCP
#                                    over the cluster link only (btl tcp,self: no shared memory)
#   scripts/netns_hosts.sh rsh HOST COMMAND...
#                                    OpenMPI's rsh launcher agent (--mca plm_rsh_agent): runs COMMAND, a
#                                    remote shell's command line, inside HOST's namespace
#
# The namespaces share this host's hostname and PID namespace: only the network is apart, which is what
# decides whether MPI can use shared memory (its transports are pinned here anyway).
set -euo pipefail

NS_A=inferd-a
NS_B=inferd-b
HOST_A=10.77.0.1
HOST_B=10.77.0.2
CLUSTER_NET=10.77.0.0/24
CLIENT_HOST=10.77.1.254  # this host's end of the client link
CLIENT_A=10.77.1.1       # machine a's end: the address a server on rank 0 listens on
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

down() {
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  ip link del inferd-client 2>/dev/null || true  # gone with inferd-a already, unless a half-made setup left it
}

up() {
  # One creator at a time: two sessions that both find them missing would trip over each other's links.
  exec 9>/run/inferd-netns.lock
  flock 9
  check 2>/dev/null && return 0
  down
  ip netns add "$NS_A"
  ip netns add "$NS_B"
  # The cluster link: a veth pair with one end in each machine.
  ip link add inferd-a0 netns "$NS_A" type veth peer name inferd-b0 netns "$NS_B"
  ip -n "$NS_A" addr add "$HOST_A/24" dev inferd-a0
  ip -n "$NS_B" addr add "$HOST_B/24" dev inferd-b0
  # The client link: this host to machine a, on a subnet of its own so that MPI, pinned to the cluster
  # subnet, never takes it.
  ip link add inferd-client type veth peer name inferd-a1 netns "$NS_A"
  ip addr add "$CLIENT_HOST/24" dev inferd-client
  ip -n "$NS_A" addr add "$CLIENT_A/24" dev inferd-a1
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_A" link set inferd-a0 up
  ip -n "$NS_B" link set inferd-b0 up
  ip -n "$NS_A" link set inferd-a1 up
  ip link set inferd-client up
  check
}

# A TCP connection from machine b to machine a (the path a daemon's call back to mpirun takes).
check() {
  ip netns exec "$NS_A" python3 - "$HOST_A" "$HOST_B" "$NS_B" <<'EOF'
import socket, subprocess, sys
a, b, ns_b = sys.argv[1:]
with socket.socket() as s:
    s.bind((a, 0)); s.listen()
    port = s.getsockname()[1]
    client = subprocess.run(["ip", "netns", "exec", ns_b, "python3", "-c",
                             f"import socket; socket.create_connection(('{a}', {port}), timeout=5).close()"])
    s.settimeout(5)
    conn, peer = s.accept()
    conn.close()
    sys.exit(0 if client.returncode == 0 and peer[0] == b else 1)
EOF
}

# The namespace a host name stands for: the cluster addresses, or the names a and b.
namespace_of() {
  case "$1" in
    "$HOST_A" | a | "$NS_A") echo "$NS_A" ;;
    "$HOST_B" | b | "$NS_B") echo "$NS_B" ;;
    *) echo "netns_hosts.sh rsh: unknown host '$1' (the machines are $HOST_A and $HOST_B)" >&2; return 1 ;;
  esac
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  check) check ;;
  rsh)
    # OpenMPI calls the agent as `agent [options] HOST COMMAND...`, COMMAND being words that a remote shell
    # would join and run; so does this, in HOST's namespace. ssh's options (none are passed to an agent
    # that is not ssh or rsh) would start with '-'.
    shift
    while [[ "${1:-}" == -* ]]; do shift; done
    ns="$(namespace_of "$1")"
    shift
    exec ip netns exec "$ns" /bin/sh -c "$*"
    ;;
  mpirun)
    shift
    exec ip netns exec "$NS_A" mpirun --host "$HOST_A,$HOST_B" \
      --mca plm_rsh_agent "$SELF rsh" \
      --mca btl tcp,self --mca btl_tcp_if_include "$CLUSTER_NET" --mca oob_tcp_if_include "$CLUSTER_NET" \
      "$@"
    ;;
  *)
    sed -n '2,23p' "$SELF" >&2
    exit 2
    ;;
esac
