#!/usr/bin/env bash
# Submit tonight's sweep to the Ray cluster and wait for its verdict. Idempotent: the
# submission id is the date, so a second call the same day (a timer that fires twice, a
# retried cron) attaches to the job already submitted instead of starting another.
#
# Environment (all have defaults for a single-machine set-up):
#   SPECSWEEP_DIR        the project checkout (the job's working dir), default: this script's repo
#   RAY_DASHBOARD        the head's dashboard, default http://127.0.0.1:8265
#   MLFLOW_TRACKING_URI  the shared tracking server, default http://127.0.0.1:5000
#   SPECSWEEP_MODEL      the model the nights measure (model.id), default: the embedded toy model
#   SPECSWEEP_EXPERIMENT the MLflow experiment on a shared server (tracking.experiment), default: nightly
#   SPECSWEEP_REFERENCE  a reference build to measure tonight beside the candidate (gate.reference,
#                        which makes the gate paired), e.g. "['engine.python=/opt/vllm-previous/bin/python']"
#   SPECSWEEP_ARGS       extra overrides; a GPU model needs its GPUs per server and a start-up allowance, e.g.
#                        "engine.device=gpu engine.tensor_parallel_size=8 engine.startup_timeout_s=3600 run.confirm_gpu_hours=12"
# Exit code: the sweep's own (0 pass, 1 regression, 3 insufficient data or a failed
# point, 4 infrastructure), read from the job's driver_exit_code.
set -euo pipefail
set -f  # no globbing: SPECSWEEP_ARGS holds overrides such as engine.env_from=[HF_TOKEN]
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
project="${SPECSWEEP_DIR:-$(dirname "$here")}"
dashboard="${RAY_DASHBOARD:-http://127.0.0.1:8265}"
tracking="${MLFLOW_TRACKING_URI:-http://127.0.0.1:5000}"
ray="${RAY_BIN:-$project/.venv/bin/ray}"
id="nightly-$(date +%F)"
export RAY_AUTH_MODE=token  # the head's token: RAY_AUTH_TOKEN where set (a pod's Secret), else ~/.ray/auth_token

if "$ray" job status --address "$dashboard" "$id" >/dev/null 2>&1; then
  echo "job $id was already submitted; following it"
  "$ray" job logs --address "$dashboard" --follow "$id" || true
else
  # The job's driver runs on the head, which does not see this shell's environment: the
  # model and the experiment travel as overrides.
  named=()
  if [ -n "${SPECSWEEP_MODEL:-}" ]; then
    echo "tonight measures $SPECSWEEP_MODEL"
  else
    echo "SPECSWEEP_MODEL is not set: tonight measures the embedded 135M toy model, a health check of the engine, not your model"
  fi
  [ -z "${SPECSWEEP_MODEL:-}" ] || named+=("model.id=$SPECSWEEP_MODEL")
  [ -z "${SPECSWEEP_EXPERIMENT:-}" ] || named+=("tracking.experiment=$SPECSWEEP_EXPERIMENT")
  [ -z "${SPECSWEEP_REFERENCE:-}" ] || named+=("gate.reference=$SPECSWEEP_REFERENCE")
  # shellcheck disable=SC2086  # SPECSWEEP_ARGS is a list of overrides
  "$ray" job submit --address "$dashboard" --submission-id "$id" --working-dir "$project" -- \
    python -m pipeline.sweep +sweep=nightly "tracking.uri=$tracking" "${named[@]}" ${SPECSWEEP_ARGS:-} || true
fi
# `ray job submit` says only 0 or 1; the sweep's own code says why.
# No answer from the dashboard, or a job that never started its driver: 4 (infrastructure).
code="$("$project/.venv/bin/python" - "$dashboard" "$id" <<'PY'
import sys
try:
    from ray.job_submission import JobSubmissionClient
    info = JobSubmissionClient(sys.argv[1]).get_job_info(sys.argv[2])
    print(info.driver_exit_code if info.driver_exit_code is not None else 4)
except Exception as exc:
    print(f"the Ray dashboard at {sys.argv[1]} does not answer for job {sys.argv[2]}: {exc}", file=sys.stderr)
    print(4)
PY
)"
echo "job $id: driver exit code $code"
exit "$code"
