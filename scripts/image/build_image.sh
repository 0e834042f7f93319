#!/bin/sh
# `make image`: build the Containerfile's two targets with the first container engine that works.
#   IMAGE=<repository> TAG=<tag> [ENGINE=podman|buildah|docker] [PYTHON_IMAGE=<base>] scripts/image/build_image.sh
# PYTHON_IMAGE replaces the Containerfile's base (python:3.11-slim-bookworm), e.g. with a copy in a
# registry mirror of your own.
# gives IMAGE:TAG (target gpuwarden, the whole stack) and IMAGE:TAG-exporter (the DaemonSet's image),
# the names helm/gpuwarden's values use by default. Exit 2, with what to do, when no engine works.
set -eu
: "${IMAGE:?IMAGE is not set}" "${TAG:?TAG is not set}"
cd "$(dirname "$0")/../.."

usable() {  # an engine "works" when it answers, not merely when it is installed
  case $1 in
    podman)  podman info >/dev/null 2>&1 ;;
    buildah) buildah info >/dev/null 2>&1 ;;
    docker)  docker info >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

engine=${ENGINE:-}
tried=""
if [ -z "$engine" ]; then
  for candidate in podman buildah docker; do
    if command -v "$candidate" >/dev/null 2>&1; then
      if usable "$candidate"; then engine=$candidate; break; fi
      tried="$tried $candidate (installed, but '$candidate info' fails: $("$candidate" info 2>&1 | grep -v '^ *$' | tail -1))"
    fi
  done
elif ! command -v "$engine" >/dev/null 2>&1 || ! usable "$engine"; then
  echo "make image: ENGINE=$engine does not work here ('$engine info' fails or it is not installed)" >&2
  exit 2
fi
if [ -z "$engine" ]; then
  echo "make image: no working container engine (looked for podman, buildah, docker;${tried:- none is installed})." >&2
  echo "make image: install podman or docker, or build the same file system from Debian and PyPI without a registry: sudo python3 scripts/build_rootfs.py --variant full" >&2
  exit 2
fi

build() {  # build TARGET NAME
  echo "make image: $engine building target $1 -> $2${PYTHON_IMAGE:+ from $PYTHON_IMAGE}" >&2
  case $engine in
    buildah) buildah build --layers ${PYTHON_IMAGE:+"--build-arg=PYTHON_IMAGE=$PYTHON_IMAGE"} \
               -f Containerfile --target "$1" -t "$2" . ;;
    *)       "$engine" build ${PYTHON_IMAGE:+"--build-arg=PYTHON_IMAGE=$PYTHON_IMAGE"} \
               -f Containerfile --target "$1" -t "$2" . ;;
  esac
}
start=$(date +%s)
build gpuwarden "$IMAGE:$TAG"
build exporter "$IMAGE:$TAG-exporter"
echo "make image: built $IMAGE:$TAG and $IMAGE:$TAG-exporter with $engine in $(( $(date +%s) - start )) s" >&2
case $engine in
  buildah) buildah images --filter "reference=$IMAGE" ;;
  *)       "$engine" images "$IMAGE" ;;
esac
