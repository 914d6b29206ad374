#!/usr/bin/env bash
# Builds the base image of `make image` without a registry: a minimal Debian bookworm root made by
# debootstrap from the host's Debian mirror, imported into podman. Debian's python3 is 3.11, the project's
# Python; the run-time libraries of Mooncake's transfer engine are included so the image build installs
# nothing from the network.
#
#   deploy/podman/base-image.sh IMAGE [MIRROR]
set -euo pipefail

image=${1:?usage: base-image.sh IMAGE [MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
suite=bookworm
# python3-venv brings ensurepip (the venv's pip); libibverbs1, libnuma1 and libcurl4 are what Mooncake's
# binaries link against (ldd of its wheel); ca-certificates for TLS clients.
packages=python3,python3-venv,libibverbs1,libnuma1,libcurl4,ca-certificates

root=$(mktemp -d "${TMPDIR:-/tmp}/knittrans-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# Nothing the image needs at run time: package lists, caches, docs and the apt archive.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*
tar -C "$root" --numeric-owner -c . | podman import --quiet \
  --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
  --message "debootstrap --variant=minbase $suite ($packages)" - "$image" >/dev/null
echo "imported $image"
