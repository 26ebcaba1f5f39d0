#!/usr/bin/env bash
# Let this host run arm64 binaries under QEMU: qemu-user-static's interpreters, registered
# with binfmt_misc (mounted first where the kernel has it but nobody mounted it).
# Idempotent.
set -euo pipefail
say() { echo "qemu: $*"; }

missing=()
[ -x /usr/bin/qemu-aarch64-static ] || missing+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || missing+=(binfmt-support)
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    say "mounting binfmt_misc"
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    say "registering qemu-aarch64"
    update-binfmts --enable qemu-aarch64 2>/dev/null || update-binfmts --import qemu-aarch64
fi
# F (fix binary): the kernel opens the interpreter at registration, so containers, which do
# not have /usr/bin/qemu-aarch64-static inside, can still run arm64 binaries.
grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
    || { say "qemu-aarch64 is registered without the F flag; containers cannot use it" >&2; exit 1; }
say "arm64 binaries run here: $(grep ^interpreter /proc/sys/fs/binfmt_misc/qemu-aarch64)"
