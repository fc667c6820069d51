#!/usr/bin/env bash
# Installs the external tools the FUSE test suites run over a birch mount
# (crates/birch-cli/tests/mount_tools.rs; docs/FUSE-TESTING.md):
#   Debian: dbench, fio, fuse3, attr, acl, xfsprogs, util-linux (setpriv and
#           fallocate, for mount_security.rs), e2fsprogs (chattr, for
#           mount_ops.rs), libacl1-dev (the headers pjdfstest builds
#           against), and btrfs-progs (kernel btrfs's send streams for
#           mount_send_receive.rs)
#   crates.io: pjdfstest (the Rust port of pjd's POSIX suite) and fsx (the
#           Rust port of the File System eXerciser), pinned versions
#   a user and group "tests" (pjdfstest switches to nobody/nogroup and
#           tests/tests)
# Idempotent: does nothing when everything is there. Needs root.
set -euo pipefail

PJDFSTEST_VERSION=0.2.2
FSX_VERSION=0.3.2

[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

need_apt=()
for pair in dbench:dbench fio:fio fusermount3:fuse3 getfattr:attr setfacl:acl mkfs.xfs:xfsprogs \
    setpriv:util-linux fallocate:util-linux chattr:e2fsprogs mkfs.btrfs:btrfs-progs; do
    command -v "${pair%%:*}" >/dev/null || need_apt+=("${pair#*:}")
done
[ -e /usr/include/sys/acl.h ] || need_apt+=(libacl1-dev)
if ((${#need_apt[@]})); then
    echo "installing: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Installs crate NAME at VERSION unless cargo already has exactly that.
cargo_tool() {
    if ! cargo install --list | grep -qx "$1 v$2:"; then
        echo "installing $1 $2"
        cargo install --quiet --locked "$1" --version "$2"
    fi
}
cargo_tool pjdfstest "$PJDFSTEST_VERSION"
cargo_tool fsx "$FSX_VERSION"

# pjdfstest's second dummy user (the first is Debian's nobody/nogroup).
if ! id tests >/dev/null 2>&1; then
    echo "adding user and group 'tests' (for pjdfstest)"
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin tests
fi
