#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for inferx_edge (idempotent).
#   bash scripts/install.sh          the package and what the main job needs
#   bash scripts/install.sh --test   also the test tools, torch (CPU), NVRTC 12, the aarch64 cross
#                                    compiler and the Fashion-MNIST dataset used by the accuracy tests
set -euo pipefail
cd "$(dirname "$0")/.."
test_deps=0
[ "${1:-}" = "--test" ] && test_deps=1

apt_pkgs=()
if [ "$test_deps" = 1 ]; then
  command -v aarch64-linux-gnu-g++ >/dev/null || apt_pkgs+=(g++-aarch64-linux-gnu)
  [ -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] || apt_pkgs+=(dataset-fashion-mnist)
  [ -x /usr/sbin/sshd ] || apt_pkgs+=(openssh-server)       # deploy tests run a real sshd on 127.0.0.1
  command -v ssh >/dev/null || apt_pkgs+=(openssh-client)
fi
command -v g++ >/dev/null || apt_pkgs+=(g++)
command -v nm >/dev/null || apt_pkgs+=(binutils)
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
fi

py=${PYTHON:-python3}
if [ "$test_deps" = 1 ]; then
  # The CPU build of torch: an unpinned 'torch' pulls a multi-GB CUDA build.
  "$py" -m pip install -q "torch==2.13.0"
  "$py" -m pip install -q -e ".[test,torch,cuda12]"
else
  "$py" -m pip install -q -e ".[test]"
fi
