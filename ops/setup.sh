#!/usr/bin/env bash
# Installs what Paddock needs on a Debian host when it is missing: Debian packages (as root, via
# apt-get) and node_modules (npm ci). Safe to run every time: it does nothing when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

# The version package.json's engines names: Node 20.6 or later (register hooks, import.meta.resolve).
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=6)?0:1)'; then
  echo "paddock: Node $(node --version) is too old: Paddock needs Node 20.6 or later" >&2
  exit 1
fi

need=()
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v crun >/dev/null 2>&1 || need+=(crun)
command -v mkfs.erofs >/dev/null 2>&1 || need+=(erofs-utils)
# The base layer copies /bin/busybox into the sandbox: it must be the static build.
if ! { [ -x /bin/busybox ] && { ldd /bin/busybox 2>&1 || true; } | grep -q 'not a dynamic'; }; then need+=(busybox-static); fi
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v mount >/dev/null 2>&1 || need+=(mount)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# FnCall compiles its static runner once per host.
{ command -v cc >/dev/null 2>&1 && [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ]; } || need+=(gcc libc6-dev)
# Images: lazy layers through FUSE (fusermount3 marks fuse3), object stores through rclone, the
# python image through debootstrap, mount(2) through perl (perl-base), git for workspaces.
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v rclone >/dev/null 2>&1 || need+=(rclone)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v perl >/dev/null 2>&1 || need+=(perl-base)
command -v git >/dev/null 2>&1 || need+=(git)
# Hardened sandboxes: flock for the host's blocks of per-sandbox id ranges (runtime/container/ids.ts),
# the per-node lxcfs that shows each sandbox its own memory and CPUs, and nft for per-sandbox egress
# policies.
command -v flock >/dev/null 2>&1 || need+=(util-linux)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# The Python client's tests run Debian's own python3 (a pyenv shim on PATH may be another one).
[ -x /usr/bin/python3 ] || need+=(python3)
# The dashboard's browser test drives Debian's Chromium (playwright-core brings no browser).
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v lxcfs >/dev/null 2>&1 || need+=(lxcfs)
[ -x /usr/sbin/nft ] || need+=(nftables)  # not `command -v`: under npm, node_modules/.bin/nft (@vercel/nft) shadows it
# MicroVMs: QEMU's microvm machine, Debian's cloud kernel for the guests (runtime/microvm/kernel.ts
# cuts its uncompressed vmlinux out of the LZ4-compressed bzImage with lz4).
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || need+=(linux-image-cloud-amd64)
command -v lz4 >/dev/null 2>&1 || need+=(lz4)
# Full VMs boot Debian's standard kernel (fetched as a package into /var/cache/paddock/kernels by
# runtime/microvm/kernel.ts, not installed); their test reads the screen with tesseract's OCR.
command -v tesseract >/dev/null 2>&1 || need+=(tesseract-ocr)
# The bridge's ssh provider is tested against real sshd servers (the client comes with openssh-client).
[ -x /usr/sbin/sshd ] || need+=(openssh-server)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "paddock: missing Debian packages: ${need[*]} (run as root, or: apt-get install ${need[*]})" >&2
    exit 1
  fi
  echo "paddock: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "paddock: npm ci" >&2
  npm ci --no-audit --no-fund >&2
fi

# The compiled SDK and nodes (dist/, tsc) and the CLI's bundle (dist/cli/): rebuilt when a source is newer than the last build.
# dist/.built, not tsc's .tsbuildinfo: a `tsc -p tsconfig.build.json --noEmit` rewrites the latter
# without emitting anything, and dist/ would then look current when it is not. `npm run build`
# touches it: a build by hand that left it old made nodes run from the sources through tsx.
if [ ! -f dist/.built ] || [ -n "$(find protocol actors bridge chronus runtime ops sdk package.json tsconfig.json tsconfig.build.json -newer dist/.built \( -name '*.ts' -o -name '*.json' \) -print -quit)" ]; then
  echo "paddock: building dist/" >&2
  npm run -s build >&2
fi
