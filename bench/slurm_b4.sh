#!/bin/bash
# Slurm's b4 from ../shared/peers/slurm/bench.sh alone (after its setup.sh; run under
# flock /work/wt/notes/slurm.lock where another session may use the lab): N one-GPU `true` jobs queued while the
# partition is DOWN, then released; time until the queue is empty.
set -euo pipefail
export SLURM_CONF=/tmp/slurmlab/etc/slurm.conf
N=${1:-1000}
W=/tmp/slurmlab/jobs/bench; mkdir -p "$W"; cd "$W"
now() { date +%s.%N; }
wait_empty() { while [ -n "$(squeue -h -o %i | head -1)" ]; do sleep 0.2; done; }
scancel -u root 2>/dev/null || true; wait_empty
echo "INFO SchedulerParameters: $(scontrol show config | sed -n 's/^SchedulerParameters *= *//p')"
scontrol update partitionname=gpu state=DOWN
for i in $(seq 1 "$N"); do sbatch -Q -o /dev/null -J gpu1 --gres=gpu:1 --wrap true; done
t0=$(now); scontrol update partitionname=gpu state=UP; wait_empty; t1=$(now)
python3 -c "print(f'RESULT b4 drain $N queued --gres=gpu:1 true jobs (16 GPUs): {$t1-$t0:.2f} s = {$N/($t1-$t0):.1f} jobs/s')"
