#!/bin/bash
# `make image` for real where no registry can be reached, then the exporter image run and read.
#
#   sudo scripts/image/buildah_check.sh [DATA_DIR]      # DATA_DIR: ../shared/data (the recorded H200)
#
# 1. A stand-in for the Containerfile's base (python:3.11-slim-bookworm cannot be pulled here):
#    Debian bookworm minbase + python3 from mmdebstrap, pip under /usr/local as the python image has
#    it, and this machine's CA bundle (so pip inside the build trusts whatever TLS proxy this
#    machine's own pip goes through). Built once, as localhost/python:3.11-slim-bookworm.
# 2. `make image` with ENGINE=buildah and that base: the Containerfile's two targets, unchanged.
#    BUILDAH_ISOLATION=chroot runs its RUN steps, as no OCI runtime can start containers here.
# 3. The exporter image started as its user (UID 10001) with `buildah run`, replaying the recorded
#    H200; its /metrics must hold the GPU. Prints both images' sizes and the build time.
# Needs root, buildah and mmdebstrap (Debian: apt-get install buildah mmdebstrap).
set -eu
cd "$(dirname "$0")/../.."
data=$(cd "${1:-../shared/data}" && pwd)
base=localhost/python:3.11-slim-bookworm
export BUILDAH_ISOLATION=chroot
work=build/image/buildah
mkdir -p "$work"

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  echo "buildah_check: building the stand-in base $base" >&2
  rm -f "$work/python-base.tar"
  mmdebstrap --variant=minbase --quiet --include=python3,python3-venv,python-is-python3,ca-certificates,usr-is-merged \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    bookworm "$work/python-base.tar"
  cp /etc/ssl/certs/ca-certificates.crt "$work/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$work/pip.conf"
  cat > "$work/Containerfile" <<'EOF'
FROM scratch
ADD python-base.tar /
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
# pip under /usr/local, where python:*-slim has it (Debian's python3-pip would be a dpkg package).
RUN rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED && wheel=$(ls /usr/share/python-wheels/pip-*.whl) \
    && python3 "$wheel/pip" install --quiet --no-index "$wheel" && python -m pip --version
CMD ["python3"]
EOF
  buildah build --quiet -f "$work/Containerfile" -t "$base" "$work" >/dev/null
fi

start=$(date +%s)
make --no-print-directory image ENGINE=buildah PYTHON_IMAGE="$base"
echo "buildah_check: make image took $(( $(date +%s) - start )) s" >&2

repository=${IMAGE:-$(sed -n 's/^IMAGE ?= //p' Makefile)}  # what `make image` named, as make reads it
image=$repository:${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}-exporter
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
container=$(buildah from "$image")
# The exporter runs in its own session (process group), so stopping it stops all of it and nothing
# else.
setsid buildah run --user 10001:10001 -v "$data:/tmp/data:ro" -e GPUWARDEN_DATA=/tmp/data "$container" -- \
  python -m gpuwarden.exporter --backend replay --listen "127.0.0.1:$port" --kubelet-socket none --interval 1 \
  --node-name buildah-check > "$work/exporter.log" 2>&1 &
runner=$!
trap 'kill -KILL -- -"$runner" 2>/dev/null || true; wait "$runner" 2>/dev/null || true; buildah rm "$container" >/dev/null 2>&1 || true' EXIT INT TERM
found=""
for _ in $(seq 1 60); do
  sleep 1
  if python3 -c "import sys, urllib.request; body = urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode()
sys.exit(0 if 'node=\"buildah-check\"' in body and 'modelName=\"NVIDIA H200\"' in body else 1)" 2>/dev/null; then
    found=yes; break
  fi
done
if [ -z "$found" ]; then
  echo "buildah_check: FAILED: no H200 on /metrics of $image; its output:" >&2
  cat "$work/exporter.log" >&2
  exit 1
fi
echo "buildah_check: $image served the replayed H200 on /metrics as UID 10001" >&2
buildah images --filter "reference=$repository"
