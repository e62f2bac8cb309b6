#!/usr/bin/env bash
# tests/golden/olmo_core_replay.sh pass|controls — meson tests golden-replay-olmo-core(-controls): OLMo-core's own
# Trainer replays a golden bundle (`olmoref golden replay --framework olmo-core`, golden/replay/olmo_core_replay.py).
#
#   pass      configs/small.toml, 10 fp32 steps on the demo corpus: the replay must hold within
#             golden/replay/rules-olmo-core.toml; prints the rules' rows (worst per-step relative differences).
#   controls  copies of that bundle (tests/golden/mutate_bundle.py) replayed against the unchanged golden trace must
#             fail, naming the step: steps 4 and 7 on each other's batch (loss from step 4), step 6's lr 1 % high
#             (lr at step 6), the z-loss dropped (loss from step 1; z too).
# Two tests rather than one so each stays within a few minutes on 2 shared cores; one thread each side.
# Exit: 0 as expected; 1 otherwise; 2 an error; 77 "SKIPPED: golden-replay-olmo-core: ..." when OLMo-core's packages
# or the demo corpus cannot be had (never a pass).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-olmo-core: $1"; exit 77; }
olmoref_ensure_olmo_core_venv olmo_core_replay
FRAMEWORK=olmo-core PY="$OLMOREF_OLMO_CORE_VENV/bin/python"
replay_make_bundle 1
if [ "${1:-pass}" = pass ]; then
  replay_same
  grep -E "^olmo_core_replay:" "$work/same.log" || true
  exit 0
fi
replay_controls
exit $replay_failed
