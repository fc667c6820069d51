#!/usr/bin/env bash
# Installs what building and mounting birch needs on a fresh Debian machine
# (fuse3 for fusermount3, a C toolchain, pkg-config) and checks the Rust
# toolchain. Idempotent; needs root for apt.
set -euo pipefail

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v cc >/dev/null || need_apt+=(build-essential)
if ((${#need_apt[@]})); then
    echo "installing: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Rust comes from rustup on this kind of machine (Debian's cargo is too old
# for this workspace, and no other download source is reachable).
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null; then
    echo "error: cargo not found: install Rust >= 1.87 with rustup" >&2
    exit 1
fi
rust_minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
if [ "$rust_minor" -lt 87 ]; then
    echo "error: $(rustc --version) is too old: birch needs Rust >= 1.87" >&2
    exit 1
fi
# /etc/fuse.conf must allow allow_other for non-root users to reach a root
# mount (the permission tests run as another user).
if [ -f /etc/fuse.conf ] && ! grep -q '^user_allow_other' /etc/fuse.conf; then
    echo user_allow_other >>/etc/fuse.conf
fi
[ -e /dev/fuse ] || { echo "error: /dev/fuse is missing: load the fuse module (modprobe fuse)" >&2; exit 1; }
# Users mount through the setuid fusermount3, which opens /dev/fuse as the
# user: udev's rule makes it 0666; a machine without udev leaves it 0600.
[ "$(stat -c %a /dev/fuse)" = 666 ] || chmod 0666 /dev/fuse
