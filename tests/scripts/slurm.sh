#!/usr/bin/env bash
# A real one-machine Slurm (Debian's slurm-wlm and munge, docs/toolchain.md):
# starts munged, slurmctld and slurmd with a private configuration, runs a
# 3-task troupe job through `srun` (each task takes its node from Slurm's
# environment: no node list written by hand), stops the daemons.
# Exits 77 (CTest: skipped) with a message where Slurm cannot be started.
#   tests/scripts/slurm.sh BUILD_DIR
set -uo pipefail
build=$1
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "starting Slurm's daemons needs root"
for b in srun slurmctld slurmd munged scontrol; do command -v "$b" > /dev/null || skip "$b is not installed (slurm-wlm, munge)"; done
[ -f /etc/munge/munge.key ] || skip "no /etc/munge/munge.key (the munge package creates it)"

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
h=$(hostname -s)
c=$(nproc)
port=$(( 21000 + RANDOM % 20000 ))
mkdir -p "$tmp/spool/ctld" "$tmp/spool/d" "$tmp/log" /run/munge
chown munge:munge /run/munge 2>/dev/null
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
if ! pgrep -x munged > /dev/null; then
  runuser -u munge -- /usr/sbin/munged --force 2> "$tmp/log/munged.log" || skip "munged did not start: $(cat "$tmp/log/munged.log")"
  pids+=("$(pgrep -x munged | head -1)")
fi
slurmctld -D -f "$SLURM_CONF" > "$tmp/log/ctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" > "$tmp/log/d.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)' && break
  sleep 0.2
done
sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)' ||
  skip "Slurm's node did not come up: $(tail -n 3 "$tmp/log/slurmctld.log" "$tmp/log/slurmd.log" 2>/dev/null | tr '\n' ' ')"

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
echo "srun -n 3 troupe_trainer --config job.toml"
timeout 150 srun -n 3 --overcommit -t 3 "$build/troupe_trainer" --config "$tmp/job.toml" > "$tmp/out.log" 2>&1
status=$?
cat "$tmp/out.log"
[ "$status" = 0 ] || { echo "FAILED: srun exited with $status"; exit 1; }
grep -q '"workers":3' "$tmp/m.jsonl" || { echo "FAILED: no metrics record"; exit 1; }
grep -q "node task1 (2 of 3)" "$tmp/out.log" || { echo "FAILED: the tasks did not take their nodes from Slurm"; exit 1; }
echo "ok: slurm"
