#!/bin/sh
# Stop the daemons validation/slurm/slurm-up.sh started (by the PIDs it recorded).
D=${KD_SLURM_DIR:-/tmp/kd-slurm}
[ -f "$D/pids" ] || exit 0
scancel --user="$(id -un)" 2> /dev/null || true
for p in $(cat "$D/pids"); do kill "$p" 2> /dev/null || true; done
sleep 1
for p in $(cat "$D/pids"); do kill -9 "$p" 2> /dev/null || true; done
rm -f "$D/pids"
