/**
 * The guest's kernel and initramfs, made once per node from what the host has installed.
 *
 * The kernel is Debian's cloud image (`linux-image-cloud-amd64`, ops/setup.sh). QEMU's microvm
 * machine boots it through its PVH entry, which only the uncompressed ELF has: the bzImage in
 * /boot carries it xz-compressed, so the ELF is cut out of it (what the kernel tree's
 * scripts/extract-vmlinux does). The initramfs is a newc cpio of Paddock's static init and agent
 * (agent.c) and the modules it loads, in dependency order from modules.dep (this kernel has
 * virtio, virtio-mmio, virtio-console, virtio-blk, virtio-net, virtio-balloon, erofs and overlayfs as modules).
 */
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { access, mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ProtocolError } from '../../protocol/index.ts';
import { withHostLock } from '../images/lock.ts';
import { run } from '../proc.ts';
import { sourceFile } from '../source.ts';
import { buildStaticBinary } from '../static-binary.ts';

const AGENT_SOURCE = sourceFile('runtime/microvm/agent.c');

/**
 * Which kernel a guest boots. `cloud` (microVMs): Debian's cloud kernel, booted through its PVH
 * entry. `generic` (full VMs): Debian's standard kernel, booted as a bzImage on q35, because only it
 * has the display and input drivers (bochs DRM for QEMU's VGA, virtio-input); the cloud kernel has
 * neither DRM nor any framebuffer a BIOS boot can use.
 */
export type KernelFlavour = 'cloud' | 'generic';

const MODULES: Record<KernelFlavour, string[]> = {
  cloud: ['virtio_mmio', 'virtio_console', 'virtio_blk', 'virtio_net', 'virtio_balloon', 'erofs', 'overlay'],
  // libcrc32c (erofs needs it) finds no crc32c algorithm without modprobe: its generic driver first.
  generic: ['crc32c_generic', 'virtio_pci', 'virtio_console', 'virtio_blk', 'virtio_net', 'virtio_balloon', 'erofs', 'overlay', 'bochs', 'virtio_input', 'evdev'],
};

export interface GuestBoot {
  /** The kernel release, e.g. 6.1.0-57-cloud-amd64. */
  release: string;
  /** What QEMU's -kernel gets: the uncompressed ELF (cloud) or the bzImage (generic). */
  vmlinux: string;
  initrd: string;
  /** Names what a template was booted from: a new kernel or agent means new templates. */
  key: string;
}

const exists = (p: string) =>
  access(p).then(
    () => true,
    () => false,
  );

interface Kernel {
  release: string;
  image: string;
  /** The directory that holds lib/modules/<release>: / for an installed kernel. */
  root: string;
}

/** The newest cloud kernel in /boot that has its modules installed. */
async function findKernel(): Promise<Kernel> {
  const names = (await readdir('/boot').catch(() => [] as string[])).filter((n) => /^vmlinuz-.*-cloud-amd64$/.test(n)).sort();
  for (const n of names.reverse()) {
    const release = n.slice('vmlinuz-'.length);
    if (await exists(`/lib/modules/${release}/modules.dep`)) return { release, image: join('/boot', n), root: '/' };
  }
  throw new ProtocolError('BACKEND_FAILED', 'microvm: no guest kernel (apt-get install linux-image-cloud-amd64; ops/setup.sh does it)');
}

export function kernelCache(): string {
  return process.env.PADDOCK_KERNEL_CACHE || '/var/cache/paddock/kernels';
}

/**
 * Debian's standard kernel for full VMs: one installed on the host if there is one, else the
 * package `linux-image-amd64` depends on, downloaded once and unpacked (not installed: the host's
 * boot loader is not touched) into the kernel cache, with its modules.dep made by depmod.
 */
export async function findGenericKernel(): Promise<Kernel> {
  const names = (await readdir('/boot').catch(() => [] as string[])).filter((n) => /^vmlinuz-.*-amd64$/.test(n) && !n.includes('-cloud-')).sort();
  for (const n of names.reverse()) {
    const release = n.slice('vmlinuz-'.length);
    if (await exists(`/lib/modules/${release}/kernel/drivers/gpu/drm/tiny/bochs.ko`)) return { release, image: join('/boot', n), root: '/' };
  }
  const cache = kernelCache();
  const cached = async (): Promise<Kernel | null> => {
    for (const release of (await readdir(cache).catch(() => [] as string[])).filter((d) => !d.startsWith('.')).sort().reverse()) {
      const root = join(cache, release);
      if (await exists(join(root, 'lib/modules', release, 'modules.dep'))) return { release, image: join(root, 'boot', `vmlinuz-${release}`), root };
    }
    return null;
  };
  const have = await cached();
  if (have) return have;
  await mkdir(cache, { recursive: true });
  return withHostLock(join(cache, '.fetch.lock'), async () => (await cached()) ?? fetchGenericKernel(cache), cached) as Promise<Kernel>;
}

async function fetchGenericKernel(cache: string): Promise<Kernel> {
  const fail = (why: string) => new ProtocolError('BACKEND_FAILED', `fullvm: no guest kernel: ${why}`);
  const show = await run('apt-cache', ['show', 'linux-image-amd64'], { timeoutMs: 60_000 }).catch((e: Error) => {
    throw fail(`apt-cache show linux-image-amd64: ${e.message}`);
  });
  const dep = /^Depends:.*?(linux-image-[0-9][^\s,(]*-amd64)/m.exec(show.stdout)?.[1];
  if (!dep) throw fail('linux-image-amd64 names no kernel package');
  const release = dep.slice('linux-image-'.length);
  const tmp = await mkdtemp(join(cache, '.fetch-'));
  try {
    await run('apt-get', ['download', '-o', 'Acquire::Retries=3', dep], { cwd: tmp, timeoutMs: 600_000 }).catch((e: Error) => {
      throw fail(`apt-get download ${dep}: ${e.message}`);
    });
    const deb = (await readdir(tmp)).find((f) => f.endsWith('.deb'));
    if (!deb) throw fail(`apt-get download ${dep} left no .deb`);
    const root = join(tmp, 'root');
    await run('dpkg-deb', ['-x', join(tmp, deb), root], { timeoutMs: 600_000 });
    await run('depmod', ['-b', root, release], { timeoutMs: 120_000 });
    await rename(root, join(cache, release));
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
  const root = join(cache, release);
  return { release, image: join(root, 'boot', `vmlinuz-${release}`), root };
}

function decompress(cmd: string, args: string[], data: Buffer): Promise<Buffer> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'ignore'] });
    const out: Buffer[] = [];
    p.stdout.on('data', (c: Buffer) => out.push(c));
    // What follows the compressed kernel in the bzImage makes the decompressor complain at the end: what it wrote is kept.
    p.on('error', () => resolve(Buffer.alloc(0)));
    p.on('close', () => resolve(Buffer.concat(out)));
    p.stdin.on('error', () => {});
    p.stdin.end(data);
  });
}

/** The compressions a bzImage may use (CONFIG_KERNEL_*): its magic and how to undo it. Debian's cloud kernel is LZ4. */
const FORMATS: { magic: number[]; cmd: string; args: string[] }[] = [
  { magic: [0x02, 0x21, 0x4c, 0x18], cmd: 'lz4', args: ['-dc'] },
  { magic: [0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00], cmd: 'xz', args: ['-dc', '--single-stream'] },
  { magic: [0x28, 0xb5, 0x2f, 0xfd], cmd: 'zstd', args: ['-dc'] },
  { magic: [0x1f, 0x8b, 0x08], cmd: 'gzip', args: ['-dc'] },
];

async function extractVmlinux(image: string): Promise<Buffer> {
  const z = await readFile(image);
  for (const f of FORMATS) {
    const magic = Buffer.from(f.magic);
    for (let at = z.indexOf(magic); at >= 0; at = z.indexOf(magic, at + 1)) {
      const elf = await decompress(f.cmd, f.args, z.subarray(at));
      if (elf.length > 4 && elf.readUInt32BE(0) === 0x7f454c46) return elf;
    }
  }
  throw new ProtocolError('BACKEND_FAILED', `microvm: found no compressed ELF kernel in ${image} (lz4, xz, zstd, gzip)`);
}

/** Modules to load, each after what it depends on, as paths below /lib/modules/<release>. */
async function moduleOrder(k: Kernel, wanted: string[]): Promise<string[]> {
  const dep = new Map<string, string[]>();
  for (const line of (await readFile(join(k.root, 'lib/modules', k.release, 'modules.dep'), 'utf8')).split('\n')) {
    const i = line.indexOf(':');
    if (i < 0) continue;
    dep.set(line.slice(0, i), line.slice(i + 1).trim().split(/\s+/).filter(Boolean));
  }
  const byName = new Map<string, string>();
  for (const p of dep.keys()) byName.set(p.slice(p.lastIndexOf('/') + 1).replace(/\.ko$/, '').replace(/-/g, '_'), p);
  const order: string[] = [];
  const visit = (p: string) => {
    if (order.includes(p)) return;
    // modules.dep lists every dependency, transitive ones too, nearest last: load from the end.
    for (const d of [...(dep.get(p) ?? [])].reverse()) visit(d);
    order.push(p);
  };
  for (const m of wanted) {
    const p = byName.get(m);
    // Built in (=y) on another kernel build: nothing to load.
    if (p) visit(p);
  }
  return order;
}

/** A newc cpio archive of regular files and directories (all root-owned). */
function cpio(entries: { name: string; data?: Buffer; mode: number }[]): Buffer {
  const parts: Buffer[] = [];
  let ino = 1;
  const pad = (n: number) => Buffer.alloc((4 - (n % 4)) % 4);
  const add = (name: string, mode: number, data: Buffer) => {
    const nameBuf = Buffer.from(`${name}\0`);
    const f = (v: number) => v.toString(16).padStart(8, '0');
    const hdr = Buffer.from(`070701${f(ino++)}${f(mode)}${f(0)}${f(0)}${f(1)}${f(0)}${f(data.length)}${f(0)}${f(0)}${f(0)}${f(0)}${f(nameBuf.length)}${f(0)}`);
    parts.push(hdr, nameBuf, pad(hdr.length + nameBuf.length), data, pad(data.length));
  };
  for (const e of entries) add(e.name, e.mode, e.data ?? Buffer.alloc(0));
  add('TRAILER!!!', 0, Buffer.alloc(0));
  return Buffer.concat(parts);
}

const made = new Map<string, Promise<GuestBoot>>();

/** The kernel and initramfs for this node's VMs, under `binDir` (built once per kernel and agent version). */
export function guestBoot(binDir: string, flavour: KernelFlavour = 'cloud'): Promise<GuestBoot> {
  const at = `${binDir}\0${flavour}`;
  let p = made.get(at);
  if (!p) {
    p = make(binDir, flavour);
    made.set(at, p);
    p.catch(() => made.delete(at));
  }
  return p;
}

async function writeAtomic(path: string, data: Buffer): Promise<void> {
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  await writeFile(tmp, data);
  await rename(tmp, path);
}

async function make(binDir: string, flavour: KernelFlavour): Promise<GuestBoot> {
  const k = flavour === 'cloud' ? await findKernel() : await findGenericKernel();
  const { release } = k;
  const dir = join(binDir, 'microvm');
  await mkdir(dir, { recursive: true });
  // q35 boots the bzImage itself (SeaBIOS' linuxboot); only microvm's PVH entry needs the ELF.
  const vmlinux = flavour === 'cloud' ? join(dir, `vmlinux-${release}`) : k.image;
  if (!(await exists(vmlinux))) await writeAtomic(vmlinux, await extractVmlinux(k.image));
  const agent = await buildStaticBinary(AGENT_SOURCE, binDir, 'microvm-agent', 'The microVM guest agent');
  const agentBytes = await readFile(agent);
  const mods = await moduleOrder(k, MODULES[flavour]);
  const modBytes = await Promise.all(mods.map((m) => readFile(join(k.root, 'lib/modules', release, m))));
  const h = createHash('sha256').update(release).update(agentBytes);
  for (const b of modBytes) h.update(b);
  const key = h.digest('hex').slice(0, 16);
  const initrd = join(dir, `initrd-${key}.cpio`);
  if (!(await exists(initrd))) {
    const names = mods.map((m) => `/lib/modules/${m.slice(m.lastIndexOf('/') + 1)}`);
    const entries = [
      { name: 'init', data: agentBytes, mode: 0o100755 },
      { name: 'lib', mode: 0o40755 },
      { name: 'lib/modules', mode: 0o40755 },
      ...names.map((n, i) => ({ name: n.slice(1), data: modBytes[i], mode: 0o100644 })),
      { name: 'modules.order', data: Buffer.from(`${names.join('\n')}\n`), mode: 0o100644 },
    ];
    await writeAtomic(initrd, cpio(entries));
  }
  return { release, vmlinux, initrd, key };
}

/** The host TSC frequency in kHz: without `tsc_early_khz` a microvm guest under TCG hangs ~1 boot in 7 calibrating it. */
export async function hostTscKhz(): Promise<number | undefined> {
  const info = await readFile('/proc/cpuinfo', 'utf8').catch(() => '');
  const m = /^cpu MHz\s*:\s*([\d.]+)/m.exec(info);
  return m ? Math.round(Number(m[1]) * 1000) : undefined;
}
