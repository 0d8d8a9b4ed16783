#!/usr/bin/env bash
# Build batchserve's CPU images without a Docker engine and without Docker Hub:
#   scripts/build-images.sh [TAG]        (TAG: dev by default)
# buildah (daemonless; as root, chroot isolation) builds docker/control-plane.Dockerfile and
# docker/worker-cpu.Dockerfile as they are, FROM a Python 3.11 base made here from Debian's archive
# with mmdebstrap (Debian bookworm's python3 is 3.11, the locks' Python). Every third-party package
# still comes from the images' lock files, hash-checked. Where Docker and Docker Hub are at hand,
# `docker build` as in docs/deploy.md builds the same images on python:3.11-slim-bookworm.
# `make debian-tools` installs buildah and mmdebstrap (Debian's packages).
#
# Environment:
#   IMAGE_PREFIX     the images' names start with it (localhost/ by default)
#   BASE_IMAGE       the Python base to build FROM; made from Debian's archive when absent
#   TORCH_CPU_LINKS  a page or folder holding torch's CPU wheel (PyTorch's CPU index by default;
#                    a folder is mounted into the build read-only)
#   IMAGES           which to build (default: "control-plane worker-cpu"; the CUDA and vLLM
#                    images start FROM nvidia/cuda, which this script does not make)
set -euo pipefail

TAG=${1:-dev}
PREFIX=${IMAGE_PREFIX:-localhost/}
BASE=${BASE_IMAGE:-localhost/batchserve-python:3.11-bookworm}
TORCH_CPU_LINKS=${TORCH_CPU_LINKS:-https://download.pytorch.org/whl/cpu/torch/}
IMAGES=${IMAGES:-control-plane worker-cpu}
export BUILDAH_ISOLATION=chroot
cd "$(dirname "$0")/.."

for tool in buildah mmdebstrap; do
    command -v "$tool" >/dev/null || { echo "$tool is missing: make debian-tools" >&2; exit 2; }
done

if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
    echo "base image $BASE: Debian bookworm (minbase) with python3 and venv, from Debian's archive"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mmdebstrap --quiet --variant=minbase \
        --include=python3,python3-venv,python-is-python3,ca-certificates \
        bookworm "$work/rootfs.tar"
    container=$(buildah from scratch)
    buildah add --quiet "$container" "$work/rootfs.tar" /
    # The base trusts what this host trusts (a proxy's own CA, where one sits between the build
    # and the package index), and pip reads the system's bundle rather than its own.
    buildah copy --quiet "$container" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$work/pip.conf"
    buildah copy --quiet "$container" "$work/pip.conf" /etc/pip.conf
    buildah config --env LANG=C.UTF-8 --cmd python3 "$container"
    buildah commit --quiet --rm "$container" "$BASE" >/dev/null
fi

torch_args=(--build-arg "TORCH_CPU_LINKS=$TORCH_CPU_LINKS")
if [[ -d $TORCH_CPU_LINKS ]]; then
    torch_args+=(--volume "$TORCH_CPU_LINKS:$TORCH_CPU_LINKS:ro")
fi

for image in $IMAGES; do
    args=(--build-arg "PYTHON_IMAGE=$BASE")
    [[ $image == worker-cpu ]] && args+=("${torch_args[@]}")
    name="${PREFIX}batchserve-$image:$TAG"
    echo "building $name (docker/$image.Dockerfile)"
    buildah bud --quiet --layers "${args[@]}" -f "docker/$image.Dockerfile" -t "$name" . >/dev/null
    buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$name"
done
