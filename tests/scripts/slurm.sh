#!/usr/bin/env bash
# A real one-machine Slurm (Debian's slurm-wlm and munge): starts munged,
# slurmctld and slurmd with a private configuration, runs a 3-task troupe job
# through `srun` (each task takes its node from Slurm's environment: no node
# list written by hand), then the same job with scripts/troupe.sbatch, and stops the daemons.
#   tests/scripts/slurm.sh BUILD_DIR           the job
#   tests/scripts/slurm.sh BUILD_DIR --skips   the skip path, with a slurmd that does not start and a host
#                                              name that does not resolve: skipped at once, nothing left
# Probes what it needs by trying it (root; the programs; munge's credentials; the host name resolving, as
# SlurmctldHost and NodeName need; both daemons starting and the node coming up; a one-task job running) and
# exits 77 (CTest: skipped) with a one-line reason where one fails. The daemons it started and its temporary
# folder are removed whatever happens (EXIT, INT, TERM); every wait has a limit.
set -uo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/netns.sh
source "$here/../../scripts/netns.sh"  # free_port_run
skip() { echo "skipped: $(echo "$*" | tr '\n' ' ' | sed 's/ *$//' | cut -c 1-400)"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

if [ "${2:-}" = --skips ]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/slurmd" "$tmp/hostname" "$tmp/t"
  printf '#!/bin/sh\necho "slurmd: fatal: Unable to determine this slurmd'"'"'s NodeName" >&2\nexit 1\n' > "$tmp/slurmd/slurmd"
  printf '#!/bin/sh\necho no-such-host-troupe.invalid\n' > "$tmp/hostname/hostname"
  chmod +x "$tmp/slurmd/slurmd" "$tmp/hostname/hostname"
  for fake in hostname slurmd; do
    status=0
    PATH=$tmp/$fake:$PATH TMPDIR=$tmp/t timeout 90 "$here/slurm.sh" "$build" > "$tmp/$fake.out" 2>&1 || status=$?
    echo "with a failing $fake: exit $status: $(cat "$tmp/$fake.out")"
    [ "$status" = 77 ] || fail "with a failing $fake: exit status $status, not 77 (skipped)"
    [ "$(wc -l < "$tmp/$fake.out")" = 1 ] || fail "with a failing $fake: not one line"
    [ -z "$(ls -A "$tmp/t")" ] || fail "with a failing $fake: left $(ls "$tmp/t") in its temporary folder"
    ! pgrep -f "$tmp/t/" > /dev/null || fail "with a failing $fake: daemons left running: $(pgrep -af "$tmp/t/")"
  done
  if grep -q '^skipped: .*needs root\|is not installed\|munge' "$tmp/hostname.out"; then
    echo "skipped: Slurm cannot start here at all: $(cat "$tmp/hostname.out")"; exit 77
  fi
  # With only slurmd faked, an earlier probe that fails with the real tools (this host's own name does not
  # resolve, as in a chroot without /etc/hosts) means Slurm cannot start here whatever slurmd does.
  if ! grep -q "^skipped: slurmd did not start" "$tmp/slurmd.out"; then
    echo "skipped: Slurm cannot start here at all: $(cat "$tmp/slurmd.out")"; exit 77
  fi
  grep -q '^skipped: the host name no-such-host-troupe.invalid does not resolve' "$tmp/hostname.out" ||
    fail "the unresolved host name is not the reason"
  grep -q "^skipped: slurmd did not start: .*Unable to determine this slurmd's NodeName" "$tmp/slurmd.out" ||
    fail "slurmd's failure is not the reason"
  echo "ok: slurm skips"
  exit 0
fi

[ "$(id -u)" = 0 ] || skip "starting Slurm's daemons needs root"
for b in srun sinfo scontrol scancel slurmctld slurmd munged munge unmunge pgrep runuser; do
  command -v "$b" > /dev/null || skip "$b is not installed (scripts/setup.sh --test: slurm-wlm, munge, procps)"
done
[ -f /etc/munge/munge.key ] || skip "no /etc/munge/munge.key (the munge package creates it)"
h=$(hostname -s 2> /dev/null)
[ -n "$h" ] || skip "hostname -s gives no host name"
timeout 10 getent hosts "$h" > /dev/null ||
  skip "the host name $h does not resolve (getent hosts $h); Slurm's SlurmctldHost and NodeName need it: add it to /etc/hosts"

tmp=$(mktemp -d)
pids=()
cleanup() {
  [ -f "$tmp/slurm.conf" ] && SLURM_CONF=$tmp/slurm.conf timeout 5 scancel --partition troupe > /dev/null 2>&1
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
  for _ in $(seq 1 30); do
    alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
    [ "$alive" = 0 ] && break; sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
c=$(nproc)
port=$(free_port_run 2)
mkdir -p "$tmp/spool/ctld" "$tmp/spool/d" "$tmp/log"
cat > "$tmp/slurm.conf" <<CONF
ClusterName=troupetest
SlurmctldHost=$h
SlurmctldPort=$port
SlurmdPort=$(( port + 1 ))
AuthType=auth/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SlurmUser=root
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmdSpoolDir=$tmp/spool/d
StateSaveLocation=$tmp/spool/ctld
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
NodeName=$h CPUs=$c State=UNKNOWN
PartitionName=troupe Nodes=$h Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$tmp/slurm.conf
last_lines() { tail -n 2 "$@" 2> /dev/null | grep -v '^==>' | grep .; }

if ! pgrep -x munged > /dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2> /dev/null
  timeout 10 runuser -u munge -- munged --force > "$tmp/log/munged.log" 2>&1 ||
    skip "munged did not start: $(last_lines "$tmp/log/munged.log")"
  pids+=("$(pgrep -n -x munged)")
fi
timeout 10 munge -n 2> "$tmp/log/munge.err" | timeout 10 unmunge > /dev/null 2>> "$tmp/log/munge.err" ||
  skip "munge cannot make and check a credential: $(last_lines "$tmp/log/munge.err")"

slurmctld -D -f "$SLURM_CONF" > "$tmp/log/ctld.out" 2>&1 &
ctld=$!; pids+=("$ctld")
slurmd -D -f "$SLURM_CONF" > "$tmp/log/d.out" 2>&1 &
d=$!; pids+=("$d")
up=0
for _ in $(seq 1 150); do
  kill -0 "$ctld" 2> /dev/null || skip "slurmctld did not start: $(last_lines "$tmp/log/ctld.out" "$tmp/log/slurmctld.log")"
  kill -0 "$d" 2> /dev/null || skip "slurmd did not start: $(last_lines "$tmp/log/d.out" "$tmp/log/slurmd.log")"
  timeout 5 sinfo -h -o %t 2> /dev/null | grep -qE '^(idle|mix|alloc)' && { up=1; break; }
  sleep 0.2
done
[ "$up" = 1 ] ||
  skip "Slurm's node did not come up within 30 s: $(last_lines "$tmp/log/slurmctld.log" "$tmp/log/slurmd.log")"
timeout 30 srun -n 1 -t 1 true > "$tmp/log/probe.out" 2>&1 ||
  skip "a one-task job does not run: $(last_lines "$tmp/log/probe.out" "$tmp/log/slurmd.log")"

head -c 32 /dev/urandom > "$tmp/secret"; chmod 600 "$tmp/secret"
cat > "$tmp/job.toml" <<JOB
model = "mlp"
algorithm = "asgd"
workers = 3
shards = 2
epochs = 1
max-steps = 300
threads = 1
progress = "none"
metrics-out = "$tmp/m.jsonl"

[cluster]
secret-file = "$tmp/secret"
slurm-port = $(( port + 10 ))
JOB
# 3 tasks on a node that may have fewer CPUs: --overcommit (as in the README).
echo "srun -n 3 --overcommit troupe_trainer --config job.toml"
timeout 150 srun -n 3 --overcommit -t 3 "$build/troupe_trainer" --config "$tmp/job.toml" > "$tmp/out.log" 2>&1
status=$?
cat "$tmp/out.log"
[ "$status" = 0 ] || fail "srun exited with $status"
grep -q '"workers":3' "$tmp/m.jsonl" || fail "no metrics record"
grep -q "node task1 (2 of 3)" "$tmp/out.log" || fail "the tasks did not take their nodes from Slurm"

# The same job as a batch job, as the README gives it for a node with fewer CPUs than tasks.
sed -e "s|^metrics-out = .*|metrics-out = \"$tmp/batch.jsonl\"|" -e "s|^slurm-port = .*|slurm-port = $(( port + 20 ))|" \
  "$tmp/job.toml" > "$tmp/batch.toml"
echo "sbatch --ntasks=3 --overcommit scripts/troupe.sbatch batch.toml"
TROUPE_TRAINER=$build/troupe_trainer timeout 150 sbatch --wait --ntasks=3 --overcommit -t 3 --output "$tmp/batch-%j.log" \
  "$here/../../scripts/troupe.sbatch" "$tmp/batch.toml" > "$tmp/sbatch.out" 2>&1
status=$?
cat "$tmp/sbatch.out" "$tmp"/batch-*.log 2> /dev/null
[ "$status" = 0 ] || fail "sbatch exited with $status"
grep -q '"workers":3' "$tmp/batch.jsonl" || fail "no metrics record from the batch job"
echo "ok: slurm"
