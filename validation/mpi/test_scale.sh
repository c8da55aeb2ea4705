#!/bin/sh
# 64 ranks on the machine of make check (oversubscribed: doc/scale.md): tp 2 x pp 4 x
# dp 8, 2 steps and a checkpoint, then a resume on 16 ranks as tp 1 x pp 2 x dp 8;
# losses equal the one-rank run's within 1e-5 and the checkpoint equals one rank's under
# h5diff (validation/scale/scale.sh says what is compared and what is excluded). The
# 256-rank version (scale.sh 256 64) is run by hand: doc/scale.md has its wall time.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
sh "$KD_SRCDIR/validation/scale/scale.sh" 64 16
