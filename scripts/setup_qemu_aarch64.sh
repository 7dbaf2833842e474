#!/usr/bin/env bash
# Prepare an aarch64 userland that runs under qemu-user on an x86-64 host, to execute aarch64
# artifacts' host code without Arm hardware (tests marked `qemu`):
#   SYSROOT/                 Debian bookworm arm64 Python 3.11 + the C/C++ runtime libraries (dpkg -x, not installed)
#   SYSROOT/site/            aarch64 wheels: numpy, apache-tvm, apache-tvm-ffi (pinned as in pyproject.toml)
# Usage: bash scripts/setup_qemu_aarch64.sh [SYSROOT]   (default ~/.cache/inferx_edge/aarch64-sysroot)
# Run a program:  qemu-aarch64-static -L SYSROOT SYSROOT/usr/bin/python3.11 ...  with PYTHONPATH=SYSROOT/site
set -euo pipefail
sysroot=${1:-$HOME/.cache/inferx_edge/aarch64-sysroot}
[ -f "$sysroot/.complete" ] && { echo "$sysroot"; exit 0; }
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
command -v qemu-aarch64-static >/dev/null || { $sudo apt-get update -qq; DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq qemu-user-static >/dev/null; }

debs=$(mktemp -d)
lists=$(mktemp -d)
mkdir -p "$lists/partial"
o="-oAPT::Architecture=arm64 -oAPT::Architectures=arm64 -oDir::State::Lists=$lists -oDir::Cache=$debs"
apt-get $o update -qq
pkgs="libc6 libgcc-s1 libstdc++6 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib zlib1g libexpat1
      libffi8 libssl3 libbz2-1.0 liblzma5 libncursesw6 libtinfo6 libreadline8 libsqlite3-0 libuuid1
      libcrypt1 libnsl2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2
      libkeyutils1 libdb5.3 libgomp1"
(cd "$debs" && apt-get $o download $pkgs >/dev/null)
rm -rf "$sysroot" && mkdir -p "$sysroot/site"
for f in "$debs"/*.deb; do dpkg -x "$f" "$sysroot"; done
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
  --platform manylinux2014_aarch64 --python-version 3.11 --implementation cp -d "$debs/wheels" \
  numpy apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post0 ml_dtypes typing_extensions
for w in "$debs"/wheels/*.whl; do python3 -m zipfile -e "$w" "$sysroot/site"; done
rm -rf "$debs" "$lists"
touch "$sysroot/.complete"
echo "$sysroot"
