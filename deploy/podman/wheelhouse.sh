#!/usr/bin/env bash
# Fills WHEELHOUSE with wheels of every dependency of the service image, so that the image build installs
# with `pip install --no-index` and needs no network.
#
#   deploy/podman/wheelhouse.sh PYTHON BASE_IMAGE WHEELHOUSE EXTRAS
#
# The project's own wheel is built on the host (PYTHON). Its dependencies are resolved by the base image's
# interpreter, in a throwaway container with the host's network: environment markers are evaluated for the
# Python the image runs (Debian's 3.11.2 needs async-timeout for redis, a 3.11.7 host does not), which
# `pip download --python-version` does not do. Only wheels are accepted: the image has no compiler.
set -euo pipefail

python=${1:?usage: wheelhouse.sh PYTHON BASE_IMAGE WHEELHOUSE EXTRAS}
base_image=${2:?}
wheelhouse=${3:?}
extras=${4:?}

mkdir -p "$wheelhouse"
rm -f "$wheelhouse"/*.whl
project=$(mktemp -d "${TMPDIR:-/tmp}/knittrans-wheel.XXXXXX")
trap 'rm -rf "$project"' EXIT
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$project" .
wheel=$(cd "$project" && ls knittrans-*.whl)

# A host whose TLS goes through its own CA (a proxy) hands its bundle to pip in the container.
cert=()
bundle=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [ -f "$bundle" ]; then
  cert=(-v "$bundle:/etc/ssl/host-ca.crt:ro" -e PIP_CERT=/etc/ssl/host-ca.crt)
fi
podman run --rm --network=host "${cert[@]}" \
  -v "$project:/project:ro" -v "$(realpath "$wheelhouse"):/wheelhouse" \
  -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-60}" \
  "$base_image" sh -euc "
    python3 -m venv /tmp/pip
    /tmp/pip/bin/pip download --quiet --only-binary=:all: --dest /wheelhouse \
      'knittrans[$extras] @ file:///project/$wheel' 'setuptools>=68' wheel
    rm -f /wheelhouse/$wheel"
echo "$(ls "$wheelhouse"/*.whl | wc -l) wheels in $wheelhouse"
