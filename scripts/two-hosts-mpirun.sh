#!/usr/bin/env bash
# Runs `mpirun` across two simulated hosts on this machine, as a multi-node launch would:
#
#   scripts/two-hosts-mpirun.sh RANKS_PER_HOST [mpirun arguments...] PROGRAM [ARGS...]
#
# Two network namespaces, each with its own host name (a UTS namespace) and address, joined by a
# veth pair: 10.77.<k>.1 and 10.77.<k>.2. Open MPI starts on the first host from a hostfile of
# both (RANKS_PER_HOST slots each), reaches the second through an rsh agent that enters its
# namespaces (as ssh would reach another machine), and talks TCP between them (the btl and oob
# restricted to the veth subnet; shared memory within a host). The ranks are placed by slot:
# ranks 0..RANKS_PER_HOST-1 on the first host. Environment for the ranks: pass `-x NAME` among
# the mpirun arguments. The namespaces, their /etc/netns host files and the temporary folder go
# when the script ends, whatever its outcome.
#
# Needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN (ip netns, unshare): without them it exits 77
# ("skipped") before starting anything. Exit status otherwise: mpirun's.
set -euo pipefail

[[ $# -ge 2 ]] || { sed -n '2,16p' "$0" >&2; exit 2; }
per_host="$1"
shift
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || { echo "two-hosts-mpirun: RANKS_PER_HOST must be a positive integer (got $per_host)" >&2; exit 2; }
for tool in ip unshare mpirun; do
  command -v "$tool" >/dev/null || { echo "two-hosts-mpirun: $tool not found: skipped" >&2; exit 77; }
done

id="$$"
a="xfh${id}a"
b="xfh${id}b"
k=$((id % 200 + 20))  # the subnet 10.77.<k>.0/24 of this run
tmp="$(mktemp -d)"
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "/etc/netns/$a" "/etc/netns/$b" "$tmp"
}
trap cleanup EXIT

skip() {
  echo "two-hosts-mpirun: $1 (needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN): skipped" >&2
  exit 77
}
ip netns add "$a" 2>/dev/null || skip "cannot create network namespace $a"
ip netns add "$b" 2>/dev/null || skip "cannot create network namespace $b"
unshare --uts true 2>/dev/null || skip "cannot create a UTS namespace"
ip link add "v${id}a" type veth peer name "v${id}b" 2>/dev/null || skip "cannot create a veth pair"
ip link set "v${id}a" netns "$a" && ip link set "v${id}b" netns "$b" &&
  ip -n "$a" addr add "10.77.$k.1/24" dev "v${id}a" &&
  ip -n "$b" addr add "10.77.$k.2/24" dev "v${id}b" || skip "cannot address the veth pair"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up || skip "cannot bring up lo in $ns"
  mkdir -p "/etc/netns/$ns" 2>/dev/null || skip "cannot write /etc/netns/$ns"
  printf '127.0.0.1 localhost\n10.77.%s.1 %s\n10.77.%s.2 %s\n' "$k" "$a" "$k" "$b" \
    >"/etc/netns/$ns/hosts"
done
ip -n "$a" link set "v${id}a" up && ip -n "$b" link set "v${id}b" up || skip "cannot bring up the veth pair"

# The rsh agent: `agent HOST COMMAND...` runs COMMAND (a shell command line, as ssh passes it)
# in HOST's namespaces, under HOST's name. The host names are the namespace names.
cat >"$tmp/agent" <<'EOF'
#!/bin/sh
host="$1"
shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
EOF
chmod +x "$tmp/agent"
printf '%s slots=%s\n%s slots=%s\n' "$a" "$per_host" "$b" "$per_host" >"$tmp/hostfile"

# mpirun itself runs on the first host. Its arguments travel quoted.
cmd="hostname $a; exec mpirun --hostfile $tmp/hostfile -np $((2 * per_host)) --map-by slot"
cmd+=" --mca plm_rsh_agent $tmp/agent --mca btl tcp,self,vader"
cmd+=" --mca btl_tcp_if_include 10.77.$k.0/24 --mca oob_tcp_if_include 10.77.$k.0/24"
[[ "$(id -u)" == 0 ]] && cmd+=" --allow-run-as-root"
for arg in "$@"; do cmd+=" $(printf '%q' "$arg")"; done
set +e
ip netns exec "$a" unshare --uts bash -c "$cmd"
status=$?
set -e
exit "$status"
