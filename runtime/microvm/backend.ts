/**
 * The microVM backend: each sandbox is a QEMU `-M microvm` guest running Debian's cloud kernel,
 * Paddock's init and agent (agent.c) from an initramfs, and the image's own EROFS layers as
 * read-only virtio-blk disks (the same layer files containers mount, from the node's layer cache)
 * under an overlay whose writable layer is a tmpfs of `diskMiB` in the guest's RAM.
 *
 * Booting under TCG takes seconds, so each (image, memory, vCPUs, disk) is booted once as a
 * template whose RAM is a file mapped shared; it is stopped and its device state saved with
 * `x-ignore-shared` (RAM is not written, the file is the RAM). A sandbox is a QEMU started with the
 * same devices, the RAM file mapped private (copy-on-write: clones share every page they have not
 * written) and `-incoming defer`, fed the device state. One such VMM per template waits started,
 * loaded and its guest run once (`spare`, warmUp), so neither QEMU's start-up (~150 ms under TCG)
 * nor the translation of the guest's code a new TCG VMM does on a first exec is on the create's
 * path. A restore, or a create from a snapshot, takes a VMM of the template waiting with nothing
 * loaded (`blank`), for the same reason. After every start or restore the agent sets the guest's clock, reseeds its RNG and gives
 * it its own hostname and machine-id (SYNC), so clones share neither entropy nor time.
 *
 * Hibernate: QMP `stop`, the state to a file (`migrate unix:` to a socket the node serves inside
 * the VMM's chroot, written to the file by a program of the node's: QEMU 7.2 has no `file:` URI,
 * and a chrooted QEMU that may not spawn has no `exec:`), the VMM exits. The program, vmdiff.c,
 * leaves out every page of guest RAM still equal to the template's. Restore starts a clone of the
 * template `-incoming` and the node sends it the file (migrateTo, migrateFrom): pages not in it are
 * the template's, shared again.
 *
 * Layout under the node directory:
 *   microvm/templates/<key>/  mem (the template's RAM, never changed once saved), dev (its device state)
 *   microvm/vms/<dir>/        meta.json (sandbox id), qmp.sock, agent.sock, qemu.pid, console.log,
 *                             qemu.err, state (while hibernated or as a snapshot source)
 *   microvm/snapshots/<name>  state of a named snapshot (with meta: the template it came from)
 *   microvm/records/<dir>.json  the sandbox's id, spec and template: root's, outside the VM's
 *                             directory (which its VMM's user owns and could rewrite)
 *
 * A VM outlives its node's process: QEMU is a process of its own and its hibernated state a file.
 * A node started again after a SIGKILL takes its predecessor's VMs up (recover): a VMM still running
 * is saved through its QMP socket as a hibernation would, and every VM whose state is on disk comes
 * back hibernated under its old id (`kept`); the node restores those that were running. Saving and
 * restoring, rather than taking over the running VMM, makes the new VMM entirely this run's: its
 * layer files opened through this run's layer cache (a lazy one's FUSE daemon died with the old
 * node), its user range and cgroup claimed by this run, its relay and tap made anew.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync } from 'node:fs';
import { chmod, chown, copyFile, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { createConnection, createServer, type Socket } from 'node:net';
import { constants as osConstants, release as osRelease } from 'node:os';
import { basename, join } from 'node:path';
import type { Logger } from 'pino';
import { diskMiBOf, type FileEntry, Limits, type NetworkPolicy, ProtocolError, type SandboxSpec, type SandboxStats } from '../../protocol/index.ts';
import { type Backend, type ExecOptions, type ExecOutcome, type HibernateOutcome, type MovableSnapshots, type SandboxFiles, type SnapshotImages, type SnapshotStore, type Snapshotting, type StoredState, verdictOf } from '../backend.ts';
import { traversable } from '../ids.ts';
import { run } from '../proc.ts';
import type { LayerManager } from '../images/layers.ts';
import type { ImageManifest, LayerRef } from '../images/store.ts';
import { Egress } from '../network/egress.ts';
import { sourceFile } from '../source.ts';
import { buildStaticBinary } from '../static-binary.ts';
import { AgentChannel, T } from './channel.ts';
import { type Jailed, VmmJail } from './jail.ts';
import { type GuestBoot, guestBoot, hostTscKhz } from './kernel.ts';
import { Qmp } from './qmp.ts';
import { RamHold } from './ramhold.ts';

/** A VMM's sockets: under its directory, or under /run when that path is too long (sockPath). */
const SOCKETS = ['qmp.sock', 'agent.sock', 'vnc.sock', 'net.sock'];

/** Removes a VM's directory and the sockets that may live outside it. */
async function removeVmDir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
  for (const f of SOCKETS) await rm(sockPath(dir, f), { force: true });
}

/** Where a unix socket path must fit: sun_path is 108 bytes with its NUL. */
const SUN_PATH_MAX = 107;
const SHORT_SOCKETS = '/run/paddock-vm';

/**
 * A VM's socket in its own directory when the path fits a unix address, else under /run (root's
 * alone): a deep PADDOCK_HOME made QEMU refuse the agent socket ("UNIX socket path ... is too long").
 */
/**
 * A VMM's outgoing migration (its device state, or all of it) into `file`, written by the node.
 * QEMU runs chrooted in its VM directory as a user of its own (jail.ts), with no shell to run
 * `exec:cat` and no way to reach `file`: it connects to a socket the node listens on inside that
 * directory (reached from here through /proc/<pid>/root, which is its chroot, and short enough for
 * a socket path however deep the directory is). The bytes go socket → file through a `cat` of
 * the node's: measured here, piping them through Node's streams made a 512 MiB VM's hibernate
 * ~0.3 s slower and its restore ~0.4 s (the event loop's chunks compete with QEMU for two cores).
 */
async function migrateTo(vmm: Sender, file: string, filter?: string[]): Promise<string> {
  const name = `out-${randomBytes(4).toString('hex')}.sock`;
  const path = join(`/proc/${vmm.pid}/root`, name);
  // Paused: the socket is cat's to read, not this process's.
  const server = createServer({ pauseOnConnect: true });
  const received = new Promise<string>((resolve, reject) => {
    server.once('connection', (sock) => {
      server.close();
      copyThrough(filter ?? ['cat'], sock, file).then(resolve, reject).finally(() => sock.destroy());
    });
  });
  received.catch(() => {});
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(path, () => resolve());
    });
    await chown(path, vmm.uid, vmm.uid);
    await vmm.qmp.cmd('migrate', { uri: `unix:/${name}` });
    await vmm.qmp.migrated();
    return await withTimeout(received, MIGRATION_DRAIN_MS, 'the end of the migration stream');
  } finally {
    server.close();
    await rm(path, { force: true });
  }
}

/**
 * The sending end of a migration: a VMM of this node's, or one a previous run of the node left
 * running (recover), known only by its pid, the owner of its directory and its QMP socket.
 */
interface Sender {
  pid: number;
  uid: number;
  qmp: Qmp;
}

const senderOf = (v: Vmm): Sender => ({ pid: v.proc.pid ?? 0, uid: v.jail.ids.hostId, qmp: v.qmp });

/** A waiting VMM (`-incoming defer`) loads `state`: QEMU listens inside its chroot, the node's `cat` sends the file. */
async function migrateFrom(vmm: Vmm, state: string): Promise<void> {
  const name = `in-${randomBytes(4).toString('hex')}.sock`;
  const path = join(`/proc/${vmm.proc.pid}/root`, name);
  try {
    await vmm.qmp.cmd('migrate-incoming', { uri: `unix:/${name}` });
    const sock = createConnection(path);
    sock.pause();
    try {
      await new Promise<void>((resolve, reject) => {
        sock.once('connect', resolve);
        sock.once('error', reject);
      });
      const sent = copyThrough(['cat', state], sock);
      sent.catch(() => {});
      await vmm.qmp.migrated(true);
      await sent;
    } finally {
      sock.destroy();
    }
  } finally {
    await rm(path, { force: true });
  }
}

/**
 * `argv` (`cat [file]`, or vmdiff) with `sock` as its stdin (into `out`) or its stdout; rejects
 * unless it exits 0, else resolves to what it said on stderr.
 */
async function copyThrough(argv: string[], sock: Socket, out?: string): Promise<string> {
  const [cmd, ...args] = argv as [string, ...string[]];
  const fd = out === undefined ? undefined : openSync(out, 'w', 0o644);
  try {
    const child = spawn(cmd, args, { stdio: fd === undefined ? ['ignore', sock, 'pipe'] : [sock, fd, 'pipe'] });
    let err = '';
    child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((resolve) => {
      child.once('error', () => resolve(-1));
      child.once('close', (c) => resolve(c));
    });
    if (code !== 0) throw new Error(`${basename(cmd)} ${args.join(' ')}${out ? ` > ${out}` : ''} failed (${code}): ${err.trim()}`);
    return err.trim();
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** How long the node waits for the last bytes of a migration QEMU says is complete. */
const MIGRATION_DRAIN_MS = 30_000;

export function sockPath(dir: string, name: string): string {
  const p = join(dir, name);
  if (Buffer.byteLength(p) <= SUN_PATH_MAX) return p;
  mkdirSync(SHORT_SOCKETS, { recursive: true, mode: 0o700 });
  return join(SHORT_SOCKETS, `${createHash('sha256').update(dir).digest('hex').slice(0, 24)}-${name}`);
}

export interface MicrovmBackendOptions {
  nodeDir: string;
  nodeId: string;
  binDir: string;
  layers: LayerManager;
  resolve: (spec: SandboxSpec) => Promise<ImageManifest>;
  log?: Logger;
  qemu?: string;
  /** 'kvm' | 'tcg' | undefined (probe: KVM when /dev/kvm exists and a boot with it succeeds, else TCG). */
  accel?: string;
  /** VMMs kept started and waiting per template (0: start one per create; and no blank one for restores either). */
  spares?: number;
  /**
   * virtio-balloon with free-page reporting (default on): pages the guest frees go back to the
   * host (QEMU discards them: a clone's private copy is dropped and the template's page shows
   * through again). Off only to measure what it saves (bench:microvm --memory).
   */
  balloon?: boolean;
  /** The image store the node reads: snapshots' states go through it to other nodes (absent: they stay on this node). */
  store?: SnapshotImages;
  /** The machine and the kernel it boots: microvm (default, the cloud kernel) or q35 with a display (full VMs, the generic kernel). */
  machine?: 'microvm' | 'q35';
}

/** A screen of a full VM, in pixels. */
export interface ScreenSize {
  width: number;
  height: number;
}

/** What a template is made of: its devices must be the same in every clone. */
export interface Shape {
  layers: string[];
  memoryMiB: number;
  cpus: number;
  diskMiB: number;
  /** Full VMs: the display's size (QEMU's VGA offers it as the preferred mode in its EDID). */
  screen?: ScreenSize;
}

export interface Template {
  key: string;
  dir: string;
  shape: Shape;
  refs: LayerRef[];
}

export interface Vmm {
  dir: string;
  proc: ChildProcess;
  qmp: Qmp;
  /** Its user and cgroup (jail.ts). */
  jail: Jailed;
  /** QEMU has exited, and its cgroup and user are gone with it. */
  exited: Promise<void>;
  /** Its template's device state is loaded already (a spare): `cont` is all it needs. */
  loaded?: boolean;
  /** A spare's guest runs already (warmUp), answering on this channel. */
  agent?: AgentChannel;
}

export interface Vm {
  id: string;
  dir: string;
  tmpl: Template;
  env: string[];
  cwd: string;
  vmm?: Vmm;
  agent?: AgentChannel;
  hibernated?: string;
  failed?: string;
  seq: number;
  /** The CPUs its spec asks for: its VMM's CPU bandwidth (a template's VMM has whole ones). */
  cpu: number;
  /** Its spec's pidsLimit, held by the guest's cgroup of the sandbox (agent.c SB_CG). */
  pids: number;
  /** Its egress link, once a policy opened anything: the tap its NIC is relayed to. */
  net?: { ifname: string; addr: string; gw: string };
  /** The relay between its VMM's NIC socket and the tap (netrelay.c), while both run. */
  relay?: ChildProcess;
  spec: SandboxSpec;
  /** Taken up after a restart with a policy that opened something: applied again once it runs. */
  renet?: NetworkPolicy;
  /** Taken up from a previous run of the node (recover). */
  adopted?: boolean;
}

/** What the node keeps of a VM to take it up after a restart (records/<dir>.json). */
interface VmRecord {
  id: string;
  template: string;
  spec: SandboxSpec;
}

const BOOT_TIMEOUT_MS = 120_000;
const NO_HITS = { oomKills: 0, pidsMax: 0 };
/** Snapshot names are file names in the node's snapshot directory. */
const SNAPSHOT_NAME = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;
/** The RNG and identity a clone gets after every restore (agent.c do_sync). */
const PIPE_GRACE_MS = 2000;

const ERRNO: Record<number, [string, string]> = {
  1: ['FORBIDDEN', 'permission denied'],
  2: ['NOT_FOUND', 'no such file or directory'],
  6: ['FORBIDDEN', 'not a regular file'],
  13: ['FORBIDDEN', 'permission denied'],
  20: ['INVALID_REQUEST', 'a component is not a directory'],
  21: ['INVALID_REQUEST', 'is a directory'],
  22: ['INVALID_REQUEST', 'invalid path'],
  27: ['DISK_LIMIT', 'file too large'],
  28: ['DISK_LIMIT', "the sandbox's writable layer is full"],
  30: ['FORBIDDEN', 'read-only'],
  36: ['INVALID_REQUEST', 'name too long'],
  39: ['INVALID_REQUEST', 'directory not empty (pass recursive)'],
  40: ['FORBIDDEN', 'a symlink where none may be'],
  122: ['DISK_LIMIT', "the sandbox's writable layer is full"],
};

export function guestError(err: number, path: string): ProtocolError {
  const [code, what] = ERRNO[err] ?? ['BACKEND_FAILED', `guest error ${err}`];
  return new ProtocolError(code as 'NOT_FOUND', `${path}: ${what}`);
}

/** SIGKILL, then waits up to 2 s for the process to be gone. */
async function killAndWait(pid: number): Promise<void> {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  for (let i = 0; i < 200 && alive(pid); i++) await new Promise((r) => setTimeout(r, 10));
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

export class MicrovmBackend implements Backend, Snapshotting, SnapshotStore, MovableSnapshots {
  readonly kind: 'microvm' | 'fullvm' = 'microvm';
  protected readonly root: string;
  protected readonly vms = new Map<string, Vm>();
  private readonly templates = new Map<string, Promise<Template>>();
  /** The state filter (vmdiff.c) and QEMU's launcher (vmm-exec.c), built by init. */
  private vmdiff?: string;
  private vmmExec?: string;
  private ramhold?: RamHold;
  private readonly spare = new Map<string, Promise<Vmm>[]>();
  /**
   * One VMM per template started and waiting for a state (nothing loaded), for restores and creates
   * from a snapshot: QEMU's start-up (~110–130 ms under TCG here) is then off their path. Started
   * by a hibernation, and again by each one taken. With the base of the template it maps: a VMM of
   * a template made again since is not given a state made against the new one.
   */
  private readonly blank = new Map<string, Promise<{ vmm: Vmm; base: string }>>();
  private closed = false;
  private boot?: GuestBoot;
  private tsc?: number;
  accel = 'tcg';
  /** Names this host's record that KVM cannot boot this guest (kvmFailedMarker). */
  private kvmMarker?: string;
  onCrash?: (id: string, why: string) => void;
  private readonly jail: VmmJail;
  /** Egress of this backend's VMs: a table of its own beside the containers' (egress.ts). */
  private readonly egress: Egress;

  constructor(
    protected readonly o: MicrovmBackendOptions,
    dirName = 'microvm',
  ) {
    this.root = join(o.nodeDir, dirName);
    this.jail = new VmmJail(`${o.nodeId}/${dirName}`);
    this.egress = new Egress(`${o.nodeId}_${dirName}`);
  }

  private get q35(): boolean {
    return this.o.machine === 'q35';
  }

  /** The machine a template's state belongs to: part of its key, so a change of it boots new ones. */
  private get machineArg(): string {
    // No PIT: an idle guest's QEMU woke ~37 times a second for it (the guest's timer is its
    // local APIC's); idle CPU per VM 0.77% of a core with it, 0.36% without (with the append below).
    return this.q35 ? 'q35,i8042=off' : 'microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=off';
  }

  async init(): Promise<void> {
    for (const d of ['templates', 'vms', 'snapshots', 'records']) await mkdir(join(this.root, d), { recursive: true });
    // A VMM opens its template's RAM file as root, before it drops to a user of its own (jail.ts);
    // the node sends it device state and snapshots itself. Searchable all the same, for tools that
    // look at a VMM's files as its user.
    await traversable(join(this.root, 'templates'));
    await traversable(join(this.root, 'snapshots'));
    this.boot = await guestBoot(this.o.binDir, this.q35 ? 'generic' : 'cloud');
    // Built now, not on a first hibernate's path (a static build takes ~0.5 s).
    this.vmdiff = await buildStaticBinary(VMDIFF_SOURCE, this.o.binDir, 'vmdiff', 'Hibernation of VMs');
    this.vmmExec = await buildStaticBinary(VMM_EXEC_SOURCE, this.o.binDir, 'vmm-exec', 'VMMs');
    this.ramhold = new RamHold(await buildStaticBinary(RAMHOLD_SOURCE, this.o.binDir, 'ramhold', 'Templates of VMs'));
    this.tsc = await hostTscKhz();
    this.accel = this.o.accel ?? (existsSync('/dev/kvm') ? 'kvm' : 'tcg');
    if (this.accel === 'kvm' && !this.o.accel) {
      this.kvmMarker = await this.kvmFailedMarker();
      if (existsSync(this.kvmMarker)) this.accel = 'tcg';
    }
  }

  /**
   * A /dev/kvm that cannot boot this guest (PVM, without VT-x: QEMU aborts setting an MSR, or the
   * kernel never answers) is found by the first template's boot, which then goes on under TCG.
   * That verdict is kept per host, for this guest, QEMU and host kernel: a template's key names
   * its accelerator, so a node that probed KVM anew at each start computed, before the probe
   * failed again, another key than the one its VMs were made from, and removed the VMs of the run
   * before as of another machine instead of taking them up.
   */
  private async kvmFailedMarker(): Promise<string> {
    const qemu = await run(this.qemu, ['--version'], { allowFail: true, timeoutMs: 10_000 }).catch(() => ({ stdout: '' }));
    const id = createHash('sha256')
      .update(JSON.stringify([this.boot?.key, qemu.stdout, osRelease(), this.kind, this.machineArg]))
      .digest('hex')
      .slice(0, 16);
    return join(this.o.binDir, 'microvm', `kvm-failed-${id}`);
  }

  private get qemu(): string {
    return this.o.qemu ?? 'qemu-system-x86_64';
  }

  private args(dir: string, shape: Shape, mem: { path: string; share: boolean }, extra: string[]): string[] {
    const boot = this.boot!;
    const append = [...GUEST_ARGS, `pdk.layers=${shape.layers.length}`, `pdk.disk=${shape.diskMiB}`];
    if (this.tsc && this.accel === 'tcg') append.push(`tsc_early_khz=${this.tsc}`, ...TCG_GUEST_ARGS);
    // q35 for a display: its PCI bus carries QEMU's VGA (bochs DRM in the guest) and virtio-input.
    // Without its PS/2 controller (i8042=off): QEMU hands input to the first device of a kind in its
    // list, and in a clone's fresh QEMU that is the PS/2 keyboard and mouse (the template's guest
    // had put the virtio ones first by starting their drivers, which a restore does not replay); its
    // VNC server then took the relative PS/2 mouse for the pointer of a live view.
    const bus = this.q35 ? 'pci' : 'device';
    const a = [
      '-M', this.machineArg,
      '-nodefaults', '-no-user-config', ...(this.q35 ? ['-display', 'none'] : ['-nographic']), '-no-reboot',
      '-accel', this.accel === 'kvm' ? 'kvm' : 'tcg,tb-size=32',
      '-cpu', this.accel === 'kvm' ? 'host' : 'max',
      '-smp', String(shape.cpus),
      '-m', `${shape.memoryMiB}M`,
      '-object', `memory-backend-file,id=mem,size=${shape.memoryMiB}M,mem-path=${mem.path},share=${mem.share ? 'on' : 'off'}`,
      '-machine', 'memory-backend=mem',
      '-kernel', boot.vmlinux, '-initrd', boot.initrd, '-append', append.join(' '),
      '-serial', `file:${join(dir, 'console.log')}`,
      '-device', `virtio-serial-${bus}`,
      '-chardev', `socket,id=agent,path=${sockPath(dir, 'agent.sock')},server=on,wait=off`,
      '-device', 'virtserialport,chardev=agent,name=paddock',
      // The one NIC, leading to a socket nobody is connected to until an egress policy opens
      // something: then the node relays it to the sandbox's tap (netrelay.c).
      '-netdev', `stream,id=net,server=on,addr.type=unix,addr.path=${sockPath(dir, 'net.sock')}`,
      '-device', `virtio-net-${bus},netdev=net,mac=52:54:00:00:00:01`,
      ...(this.o.balloon === false ? [] : ['-device', `virtio-balloon-${bus},free-page-reporting=on`]),
      '-qmp', `unix:${sockPath(dir, 'qmp.sock')},server=on,wait=off`,
      '-pidfile', join(dir, 'qemu.pid'),
      '-name', `paddock-${this.o.nodeId}`,
      // No spawn: migrations go over sockets the node serves (migrateTo, migrateFrom). set*id stays
      // allowed: QEMU loads this filter before `-runas` drops to the VMM's user (jail.ts), and with
      // no capability left after the drop, and no_new_privs set by the filter, they gain nothing.
      '-sandbox', 'on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny',
    ];
    shape.layers.forEach((l, i) => {
      a.push('-drive', `id=l${i},file=${l},format=raw,if=none,readonly=on`, '-device', `virtio-blk-${bus},drive=l${i},serial=pdk-l${i}`);
    });
    if (shape.screen) {
      const { width, height } = shape.screen;
      // A tablet, not a mouse: absolute coordinates, so a click lands where it is asked to.
      a.push('-vga', 'none', '-device', `VGA,id=pdk-vga,edid=on,xres=${width},yres=${height},vgamem_mb=${vgaMiB(shape.screen)}`, '-device', 'virtio-keyboard-pci,id=pdk-kbd', '-device', 'virtio-tablet-pci,id=pdk-tablet');
    }
    return [...a, ...extra, ...this.extraArgs(dir)];
  }

  private async start(dir: string, shape: Shape, mem: { path: string; share: boolean }, extra: string[]): Promise<Vmm> {
    const jail = await this.jail.enter(basename(dir), dir, { cpu: shape.cpus, memoryMiB: shape.memoryMiB });
    let errFd: number;
    try {
      errFd = openSync(join(dir, 'qemu.err'), 'a');
    } catch (e) {
      await this.jail.release(jail);
      throw e;
    }
    // Through vmm-exec: QEMU 7.2 would punch holes in the template's RAM file (vmm-exec.c).
    const { cmd, args } = this.jail.command(jail, this.vmmExec as string, [this.qemu, ...this.args(dir, shape, mem, extra)]);
    const proc = spawn(cmd, args, { stdio: ['ignore', 'ignore', errFd] });
    closeSync(errFd);
    const exited = new Promise<void>((resolve) => {
      proc.once('exit', () => resolve());
      proc.once('error', () => resolve());
    }).then(() => this.jail.release(jail).catch((err: unknown) => this.o.log?.warn({ err, dir }, 'microvm: a VMM cgroup outlived its QEMU')));
    const gone = exited.then(() => {
      throw new ProtocolError('BACKEND_FAILED', `microvm: QEMU exited: ${lastLines(join(dir, 'qemu.err')) || 'no message'}`);
    });
    gone.catch(() => {});
    const qmp = await Promise.race([Qmp.open(sockPath(dir, 'qmp.sock'), undefined, () => lastLines(join(dir, 'qemu.err'))), gone]);
    return { dir, proc, qmp, jail, exited };
  }

  /** Arguments of a subclass's own for every VMM (a full VM's VNC socket). */
  protected extraArgs(_dir: string): string[] {
    return [];
  }

  /** Run in a template's guest once it answers, before its state is saved (a full VM starts its desktop). */
  protected async prepareTemplate(_agent: AgentChannel, _image: ImageManifest, _dir: string): Promise<void> {}

  protected async stopVmm(v: Vmm | undefined): Promise<void> {
    if (!v) return;
    v.agent?.close();
    v.qmp.close();
    if (vmmRuns(v)) v.proc.kill('SIGKILL');
    await v.exited;
  }

  /** Stops a VMM no sandbox has (a spare, a blank one, one whose load failed) and removes its directory. */
  private async discard(v: Vmm | undefined): Promise<void> {
    await this.stopVmm(v);
    if (v) await removeVmDir(v.dir);
  }

  // ─── templates ────────────────────────────────────────────────────────────────────────────

  /** The screen a spec asks for (full VMs); none for a microVM. */
  protected screenOf(_spec: SandboxSpec): ScreenSize | undefined {
    return undefined;
  }

  private async shapeOf(spec: SandboxSpec): Promise<{ shape: Shape; refs: LayerRef[]; image: ImageManifest }> {
    const image = await this.o.resolve(spec);
    const refs = image.layers;
    const layers = await Promise.all(refs.map((r) => this.o.layers.acquireFile(r)));
    const shape: Shape = { layers, memoryMiB: spec.memoryMiB, cpus: Math.max(1, Math.ceil(spec.cpu)), diskMiB: diskMiBOf(spec) };
    const screen = this.screenOf(spec);
    if (screen) shape.screen = screen;
    return { shape, refs, image };
  }

  private template(shape: Shape, refs: LayerRef[], image: ImageManifest): Promise<Template> {
    const key = createHash('sha256')
      .update(JSON.stringify({ boot: this.boot!.key, digests: refs.map((r) => r.digest), m: shape.memoryMiB, c: shape.cpus, d: shape.diskMiB, a: this.accel, s: shape.screen, k: this.kind, M: this.machineArg, g: [GUEST_ARGS, TCG_GUEST_ARGS], b: this.o.balloon !== false, r: TEMPLATE_REVISION }))
      .digest('hex')
      .slice(0, 20);
    let t = this.templates.get(key);
    if (!t) {
      t = this.makeTemplate(key, shape, refs, image);
      this.templates.set(key, t);
      t.then(
        // (A KVM key whose probe failed resolves to TCG's template, which holds its own.)
        (tmpl) => {
          if (tmpl.key === key) void this.ramhold?.hold(join(tmpl.dir, 'mem')).catch((err: unknown) => this.o.log?.warn({ err, key }, `${this.kind}: holding a template's RAM file in the page cache failed`));
        },
        () => this.templates.delete(key),
      );
    }
    return t;
  }

  private async makeTemplate(key: string, shape: Shape, refs: LayerRef[], image: ImageManifest): Promise<Template> {
    const dir = join(this.root, 'templates', key);
    if (existsSync(join(dir, 'dev'))) return { key, dir, shape, refs };
    const tmp = `${dir}.tmp-${randomBytes(4).toString('hex')}`;
    const accel = this.accel;
    let vmm: Vmm | undefined;
    try {
      await rm(tmp, { recursive: true, force: true });
      vmm = await this.start(tmp, shape, { path: join(tmp, 'mem'), share: true }, []);
      const agent = await AgentChannel.open(sockPath(tmp, 'agent.sock'));
      // The KVM probe is this boot: a kernel that cannot run under it never answers.
      await withTimeout(this.ping(agent, BOOT_TIMEOUT_MS), accel === 'kvm' ? 30_000 : BOOT_TIMEOUT_MS, 'the template guest did not answer');
      await this.prepareTemplate(agent, image, tmp);
      agent.close();
      await vmm.qmp.cmd('stop');
      await vmm.qmp.cmd('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: true }] });
      await migrateTo(senderOf(vmm), join(tmp, 'dev'));
      await vmm.qmp.cmd('quit').catch(() => {});
      await vmm.exited;
      for (const f of [...SOCKETS, 'qemu.pid']) await rm(f.endsWith('.sock') ? sockPath(tmp, f) : join(tmp, f), { force: true });
      await shareReadOnly(tmp);
      await rename(tmp, dir).catch(async (e: NodeJS.ErrnoException) => {
        // Made meanwhile by a node sharing the directory: use theirs.
        if (e.code !== 'ENOTEMPTY' && e.code !== 'EEXIST') throw e;
        await rm(tmp, { recursive: true, force: true });
      });
      this.o.log?.info({ key, accel, shape: { ...shape, layers: shape.layers.length } }, `${this.kind} template booted`);
      return { key, dir, shape, refs };
    } catch (e) {
      await this.stopVmm(vmm);
      await rm(tmp, { recursive: true, force: true });
      // The KVM probe failed: TCG from now on, and for the nodes this host starts later. The
      // template is made under TCG's key, not this one: it is TCG's machine.
      if (accel !== 'kvm' || this.o.accel) throw e;
      this.o.log?.warn({ err: e }, 'microvm: a guest does not boot under KVM here: TCG from now on');
      if (this.accel === 'kvm') {
        this.accel = 'tcg';
        if (this.kvmMarker) await writeFile(this.kvmMarker, `${(e as Error).message}\n`).catch(() => {});
      }
      return this.template(shape, refs, image);
    }
  }

  /** A VMM started for this template and waiting for its state. */
  private startClone(tmpl: Template, dir = join(this.root, 'vms', randomBytes(6).toString('hex'))): Promise<Vmm> {
    // The capability is in every stream a clone writes too (hibernate, snapshot): set on every receiver.
    return this.start(dir, tmpl.shape, { path: join(tmpl.dir, 'mem'), share: false }, ['-incoming', 'defer', '-S']).then(async (v) => {
      await v.qmp.cmd('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: true }] });
      return v;
    });
  }

  /** A spare: started, its template's state loaded, its guest run once (warmUp) and left running until a create takes it. */
  private async startSpare(tmpl: Template): Promise<Vmm> {
    const v = await this.startClone(tmpl);
    try {
      await this.load(v, join(tmpl.dir, 'dev'));
      v.loaded = true;
      await this.warmUp(v);
    } catch (e) {
      await this.discard(v);
      throw e;
    }
    return v;
  }

  /**
   * Runs a spare's guest through what a first exec does. Under TCG a new QEMU translates the
   * guest's code afresh as it first runs it: in a create from a spare left paused, that first exec
   * was ~100–300 ms of ~340 ms. The spare then runs idle (under 1% of a core) until a create takes
   * it; SYNC gives it its own clock, RNG seed, hostname and machine-id then, as it did before.
   */
  private async warmUp(v: Vmm): Promise<void> {
    const agent = await AgentChannel.open(sockPath(v.dir, 'agent.sock'));
    v.agent = agent;
    await v.qmp.cmd('cont');
    const ran = new Promise<void>((resolve, reject) => {
      const xid = agent.exec(['true'], [], '/', { out: () => {}, err: () => {}, exit: (status) => (status === 0 ? resolve() : reject(new Error(`the warm-up exec ended with status ${status}`))) });
      agent.stdin(xid, Buffer.alloc(0));
    });
    await withTimeout(ran, BOOT_TIMEOUT_MS, 'the spare guest did not run a command');
  }

  /**
   * A VMM waiting for a state of `tmpl`'s machine: the blank one if it is ready or coming, else one
   * started now. The caller starts the next blank once its guest runs (`startBlank`): started here,
   * its QEMU's start-up took CPU from the load (386 against ~270 ms for 69 MiB on two cores).
   */
  private async takeBlank(tmpl: Template): Promise<Vmm> {
    const waiting = this.blank.get(tmpl.key);
    this.blank.delete(tmpl.key);
    const got = await waiting?.catch(() => undefined);
    if (got && vmmRuns(got.vmm) && got.base === (await baseOf(tmpl).catch(() => ''))) return got.vmm;
    await this.discard(got?.vmm);
    return this.startClone(tmpl);
  }

  /** Starts `tmpl`'s blank VMM unless one is there or coming. */
  private startBlank(tmpl: Template): void {
    if (this.closed || this.o.spares === 0 || this.blank.has(tmpl.key)) return;
    const p = baseOf(tmpl).then(async (base) => ({ vmm: await this.startClone(tmpl), base }));
    p.catch((err: unknown) => {
      if (this.blank.get(tmpl.key) === p) this.blank.delete(tmpl.key);
      this.o.log?.debug({ err }, `${this.kind}: a blank VMM did not start`);
    });
    this.blank.set(tmpl.key, p);
  }

  /** A VMM for a new clone of `tmpl`: a spare if one is ready or coming (another starts in its place), else one started now. */
  private async takeVmm(tmpl: Template): Promise<Vmm> {
    const want = this.o.spares ?? 1;
    const pool = this.spare.get(tmpl.key) ?? [];
    this.spare.set(tmpl.key, pool);
    const got = pool.shift();
    while (pool.length < want) {
      const p = this.startSpare(tmpl);
      p.catch(() => {});
      pool.push(p);
    }
    const v = got ? await got.catch(() => undefined) : undefined;
    if (v && !v.agent?.broken && vmmRuns(v)) return v;
    // A spare that failed to start, or whose guest died while it waited: a VMM of its own instead.
    await this.discard(v);
    return this.startClone(tmpl);
  }

  private async ping(agent: AgentChannel, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    // Before the guest opens its port, what the host writes is dropped: ask again until it answers.
    for (;;) {
      const r = await withTimeout(agent.request(T.PING), 200, 'ping').catch((e: unknown) => e as Error);
      if (!(r instanceof Error)) return;
      if (agent.broken || Date.now() > deadline) throw r;
    }
  }

  /** Brings `vm` up from `state` (template device state or a full snapshot) in a waiting VMM. */
  private async load(vmm: Vmm, state: string): Promise<void> {
    try {
      await migrateFrom(vmm, state);
    } catch (e) {
      await Promise.race([vmm.exited, new Promise((r) => setTimeout(r, 500))]);
      throw new ProtocolError('BACKEND_FAILED', `microvm: loading ${state} failed: ${(e as Error).message}: ${lastLines(join(vmm.dir, 'qemu.err'))}`);
    }
  }

  /** `beforeRun`: after the state is loaded, before the guest runs on from it. */
  private async incoming(vm: Vm, vmm: Vmm, state: string, beforeRun?: () => Promise<void>): Promise<void> {
    if (!vmm.loaded) {
      const base = await readFile(`${state}.base`, 'utf8').catch(() => undefined);
      const now = base === undefined ? undefined : await baseOf(vm.tmpl);
      if (base !== now) {
        throw new ProtocolError('BACKEND_FAILED', `${this.kind}: ${state} holds only what differs from template ${vm.tmpl.key}'s RAM, and that template has been made again since: it cannot be loaded (${base} then, ${now} now)`);
      }
      await this.load(vmm, state);
    }
    await beforeRun?.();
    const agent = vmm.agent ?? (await AgentChannel.open(sockPath(vmm.dir, 'agent.sock')));
    vmm.agent = undefined;
    agent.onBroken = (why) => {
      if (vm.vmm === vmm && !vm.hibernated) {
        vm.failed = why;
        this.onCrash?.(vm.id, why);
      }
    };
    await this.jail.setCpu(vmm.jail, vm.cpu);
    await vmm.qmp.cmd('cont');
    vm.vmm = vmm;
    vm.agent = agent;
    vm.dir = vmm.dir;
    await this.sync(vm);
    // Restored from hibernation: the guest kept its address, its new VMM needs the relay again.
    if (vm.net) await this.relay(vm as Vm & { vmm: Vmm; net: NonNullable<Vm['net']> });
  }

  // ─── egress (runtime/network/egress.ts, netrelay.c) ───────────────────────────────────────

  async setNetwork(id: string, policy: NetworkPolicy): Promise<void> {
    const vm = this.running(id);
    await this.egress.set(id, { attach: (link) => this.attachNet(vm, link) }, policy, async (text) => {
      await this.files(id).write('/etc/resolv.conf', Buffer.from(text));
    });
    // The policy it runs under now is the one to apply again if a restarted node takes it up.
    vm.spec = { ...vm.spec, network: policy };
    await this.writeRecord(vm);
  }

  /** The VM's new tap: relayed to its NIC, and the guest's eth0 given its address and route. */
  private async attachNet(vm: Vm & { agent: AgentChannel; vmm: Vmm }, link: NonNullable<Vm['net']>): Promise<void> {
    vm.net = link;
    await this.relay(vm as Vm & { vmm: Vmm; net: NonNullable<Vm['net']> });
    const ip = (a: string) => Buffer.from(a.split('.').map(Number));
    const r = await withTimeout(vm.agent.request(T.NET, Buffer.concat([ip(link.addr), Buffer.from([30]), ip(link.gw)])), 10_000, 'the guest agent did not answer');
    if (r.err) throw new ProtocolError('BACKEND_FAILED', `microvm: the guest could not configure its network (errno ${r.err})`);
  }

  private async relay(vm: Vm & { vmm: Vmm; net: NonNullable<Vm['net']> }): Promise<void> {
    vm.relay?.kill('SIGKILL');
    const bin = await buildStaticBinary(NETRELAY_SOURCE, this.o.binDir, 'netrelay', 'Networking of VMs');
    const child = spawn(bin, [vm.net.ifname, sockPath(vm.vmm.dir, 'net.sock')], { stdio: ['ignore', 'ignore', 'pipe'] });
    const said = await new Promise<string>((resolve) => {
      let err = '';
      child.stderr.on('data', (d: Buffer) => {
        err += d.toString();
        if (err.includes('\n')) resolve(err.slice(0, err.indexOf('\n')));
      });
      child.once('close', () => resolve(err.trim() || 'error netrelay: ended'));
      child.once('error', (e) => resolve(`error spawn: ${e.message}`));
    });
    if (said !== 'ok') {
      child.kill('SIGKILL');
      throw new ProtocolError('BACKEND_FAILED', `microvm: the network relay of sandbox ${vm.id}: ${said.replace(/^error /, '')}`);
    }
    child.stderr.resume();
    vm.relay = child;
    child.once('exit', () => {
      if (vm.relay === child) vm.relay = undefined;
    });
  }

  private async sync(vm: Vm): Promise<void> {
    const t = Buffer.alloc(8);
    t.writeBigUInt64LE(BigInt(Date.now()) * 1_000_000n);
    const host = Buffer.from(`${vm.id.replace(/[^A-Za-z0-9-]/g, '').slice(0, 60) || 'sandbox'}\0`);
    const machineId = Buffer.from(randomBytes(16).toString('hex'));
    const pids = Buffer.alloc(4);
    pids.writeUInt32LE(vm.pids);
    const r = await withTimeout(vm.agent!.request(T.SYNC, t, randomBytes(32), host, machineId, pids), 10_000, 'the guest agent did not answer');
    if (r.err) throw new ProtocolError('BACKEND_FAILED', `microvm: sync failed (${r.err})`);
  }

  // ─── Backend ──────────────────────────────────────────────────────────────────────────────

  async create(id: string, spec: SandboxSpec, from?: { state: string; tmpl: Template }): Promise<void> {
    if (this.vms.has(id)) throw new ProtocolError('ALREADY_EXISTS', `sandbox ${id} exists`);
    const { shape, refs, image } = await this.shapeOf(spec);
    const vm: Vm = { id, dir: '', tmpl: undefined as unknown as Template, ...this.processOf(spec, image), seq: 0, cpu: spec.cpu, pids: spec.pidsLimit, spec };
    this.vms.set(id, vm);
    try {
      const t0 = performance.now();
      vm.tmpl = from?.tmpl ?? (await this.template(shape, refs, image));
      const t1 = performance.now();
      // From a snapshot: a blank VMM (spares hold their template's state, not the snapshot's).
      const vmm = await (from ? this.takeBlank(vm.tmpl) : this.takeVmm(vm.tmpl));
      const t2 = performance.now();
      vm.dir = vmm.dir;
      await this.claim(vm, vmm.dir);
      await this.incoming(vm, vmm, from?.state ?? join(vm.tmpl.dir, 'dev'));
      if (spec.network) await this.setNetwork(id, spec.network);
      if (from) this.startBlank(vm.tmpl);
      const ms = (a: number, b: number) => Math.round(b - a);
      this.o.log?.debug({ id, templateMs: ms(t0, t1), vmmMs: ms(t1, t2), loadMs: ms(t2, performance.now()) }, 'microvm started');
    } catch (e) {
      await this.destroy(id);
      throw e;
    }
  }

  private processOf(spec: SandboxSpec, image: ImageManifest): { env: string[]; cwd: string } {
    return { env: [...image.env, ...Object.entries(spec.env ?? {}).map(([k, v]) => `${k}=${v}`)], cwd: spec.cwd ?? (image.cwd || '/') };
  }

  private recordFile(dir: string): string {
    return join(this.root, 'records', `${basename(dir)}.json`);
  }

  /** `dir` becomes `vm`'s: its id in the directory (meta.json, for recover's report) and its record. */
  private async claim(vm: Vm, dir: string): Promise<void> {
    await writeFile(join(dir, 'meta.json'), JSON.stringify({ id: vm.id, template: vm.tmpl.key }));
    await this.writeRecord(vm, dir);
  }

  private async writeRecord(vm: Vm, dir = vm.dir): Promise<void> {
    const r: VmRecord = { id: vm.id, template: vm.tmpl.key, spec: vm.spec };
    const file = this.recordFile(dir);
    await writeFile(`${file}.tmp`, JSON.stringify(r));
    await rename(`${file}.tmp`, file);
  }

  protected get(id: string): Vm {
    const vm = this.vms.get(id);
    if (!vm) throw new ProtocolError('NOT_FOUND', `no sandbox ${id} on this backend`);
    return vm;
  }

  protected running(id: string): Vm & { agent: AgentChannel; vmm: Vmm } {
    const vm = this.get(id);
    if (vm.failed) throw new ProtocolError('BACKEND_FAILED', `microvm: sandbox ${id} failed: ${vm.failed}`);
    if (!vm.agent || !vm.vmm) throw new ProtocolError('INVALID_STATE', `sandbox ${id} is not running`);
    return vm as Vm & { agent: AgentChannel; vmm: Vmm };
  }

  async exec(id: string, opts: ExecOptions): Promise<ExecOutcome> {
    const vm = this.running(id);
    const env = [...vm.env, ...Object.entries(opts.env ?? {}).map(([k, v]) => `${k}=${v}`)];
    const started = performance.now();
    return new Promise<ExecOutcome>((resolve) => {
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      const seen = { out: 0, err: 0 };
      let truncated = false;
      let timedOut = false;
      let noSpace = false;
      let done = false;
      let grace: NodeJS.Timeout | undefined;
      const take = (which: 'out' | 'err', chunk: Buffer) => {
        if (which === 'err' && chunk.includes('No space left on device')) noSpace = true;
        const room = opts.maxOutputBytes - seen[which];
        if (room <= 0) {
          if (!truncated) {
            truncated = true;
            stop();
          }
          return;
        }
        const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
        seen[which] += part.length;
        if (!opts.discard) (which === 'out' ? out : err).push(part);
        opts.onOutput?.(which, part);
        if (chunk.length > room) {
          truncated = true;
          stop();
        }
      };
      /** `limits`: the guest's EXIT bits (agent.c): the sandbox's OOM kills, pids-limit hits went up while it ran. */
      const finish = (status: number, limits = 0) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        clearTimeout(grace);
        opts.signal?.removeEventListener('abort', stop);
        let exitCode: number;
        let signal: string | undefined;
        if (status < 0) exitCode = 137;
        else if ((status & 0x7f) === 0) exitCode = (status >> 8) & 0xff;
        else {
          const n = status & 0x7f;
          exitCode = 128 + n;
          signal = Object.entries(osConstants.signals).find(([, v]) => v === n)?.[0];
        }
        const o: ExecOutcome = { exitCode, stdout: Buffer.concat(out), stderr: Buffer.concat(err), durationMs: Math.round((performance.now() - started) * 1000) / 1000, truncated, timedOut };
        if (signal) o.signal = signal;
        if (noSpace) o.noSpace = true;
        o.verdict = verdictOf(o, NO_HITS, { oomKills: limits & 1, pidsMax: (limits >> 1) & 1 }, false, opts.signal);
        resolve(o);
      };
      let xid = 0;
      function stop() {
        if (done) return;
        vm.agent.kill(xid);
        // A guest that no longer answers must not hold the exec: give up after a grace period.
        grace ??= setTimeout(() => {
          vm.agent.forget(xid);
          finish(-1);
        }, PIPE_GRACE_MS);
      }
      xid = vm.agent.exec(opts.cmd, env, opts.cwd ?? vm.cwd, { out: (c) => take('out', c), err: (c) => take('err', c), exit: finish });
      const stdin = opts.stdin ? Buffer.from(opts.stdin) : Buffer.alloc(0);
      for (let i = 0; i < stdin.length; i += 64 * 1024) vm.agent.stdin(xid, stdin.subarray(i, i + 64 * 1024));
      vm.agent.stdin(xid, Buffer.alloc(0));
      const timer = setTimeout(() => {
        timedOut = true;
        stop();
      }, opts.timeoutMs);
      if (opts.signal?.aborted) stop();
      else opts.signal?.addEventListener('abort', stop, { once: true });
    });
  }

  files(id: string): SandboxFiles {
    const req = async (type: number, path: string, ...parts: Buffer[]) => {
      const vm = this.running(id);
      const r = await vm.agent.request(type, ...parts);
      if (r.err) throw guestError(r.err, path);
      return r.data;
    };
    const z = (s: string) => Buffer.from(`${s}\0`);
    return {
      read: async (path, offset = 0, length = Limits.files.chunkMax) => {
        const h = Buffer.alloc(12);
        h.writeBigUInt64LE(BigInt(offset), 0);
        h.writeUInt32LE(Math.min(length, Limits.files.chunkMax), 8);
        const d = await req(T.FREAD, path, h, z(path));
        const size = Number(d.readBigUInt64LE(0));
        const data = d.subarray(8);
        return { data, size, eof: offset + data.length >= size };
      },
      write: async (path, data, opts = {}) => {
        if (data.length > Limits.files.chunkMax) throw new ProtocolError('PAYLOAD_TOO_LARGE', `write chunk larger than ${Limits.files.chunkMax} bytes`);
        const h = Buffer.alloc(16);
        h.writeBigUInt64LE(opts.offset === undefined ? 0xffffffffffffffffn : BigInt(opts.offset), 0);
        h.writeUInt32LE(opts.mode === undefined ? 0xffffffff : opts.mode & 0o7777, 8);
        const p = z(path);
        h.writeUInt32LE(p.length, 12);
        const d = await req(T.FWRITE, path, h, p, Buffer.from(data));
        return { size: Number(d.readBigUInt64LE(0)) };
      },
      list: async (path) => {
        const d = await req(T.FLIST, path, z(path));
        const entries: FileEntry[] = [];
        for (let at = 0; at + 23 <= d.length; ) {
          const t = String.fromCharCode(d[at]!);
          const nl = d.readUInt16LE(at + 21);
          const raw = d.subarray(at + 23, at + 23 + nl);
          const e: FileEntry = { name: raw.toString('utf8'), type: t === 'f' ? 'file' : t === 'd' ? 'dir' : t === 'l' ? 'symlink' : 'other', size: Number(d.readBigUInt64LE(at + 5)), mode: d.readUInt32LE(at + 1), mtimeMs: Number(d.readBigUInt64LE(at + 13)) };
          if (!Buffer.from(e.name).equals(raw)) e.nameBytes = new Uint8Array(raw);
          entries.push(e);
          at += 23 + nl;
        }
        return entries.sort((a, b) => Buffer.compare(Buffer.from(a.name), Buffer.from(b.name)));
      },
      remove: async (path, recursive) => {
        await req(T.FREMOVE, path, Buffer.from([recursive ? 1 : 0]), z(path));
      },
    };
  }

  async pause(id: string): Promise<void> {
    await this.running(id).vmm.qmp.cmd('stop');
  }

  async resume(id: string): Promise<void> {
    await this.running(id).vmm.qmp.cmd('cont');
  }

  /**
   * Writes the state of a running VM to `file`; the VM is left stopped. The node reads the stream
   * from a socket in the VMM's chroot and writes the file: it is the node's (root's, readable: a
   * clone's VMM reads it as a user of its own).
   *
   * With `base` (its template), the file leaves out every page of guest RAM still equal to the
   * template's (vmdiff.c): it can be loaded only into a clone of that template as it is on disk
   * now, which `${file}.base` names (checked by `incoming`). Hibernations and forks' snapshots stay
   * on this node and are saved so; a snapshot that may go to another node (whose template of the
   * same machine was booted on its own) holds every page.
   *
   * QEMU still reads every page of guest RAM to write the stream. A page the clone never touched
   * reads through to the template file, and where that file has a hole (memory the template's
   * guest never used) the kernel first allocates and zeroes a page-cache page for it: measured
   * here, ~0.7 s of a 512 MiB VM's ~1.2 s hibernate, and ~0.5 s for one right after, while those
   * pages are still cached. So the node keeps each template's file mapped (ramhold.c).
   */
  private async save(from: Sender, file: string, base?: Template): Promise<number> {
    const q = from.qmp;
    const part = `${file}.part-${randomBytes(4).toString('hex')}`;
    try {
      const filter = base && this.vmdiff ? [this.vmdiff, join(base.dir, 'mem'), RAM_BLOCK] : undefined;
      await q.cmd('stop');
      await q.cmd('migrate-set-parameters', { 'max-bandwidth': 64 * 1024 * 1024 * 1024 });
      const said = await migrateTo(from, part, filter);
      if (base) this.o.log?.debug({ file, said }, `${this.kind}: state saved as a difference from its template`);
      // The base before the file: a difference is never without it (a whole state with one is harmless).
      if (base) await writeFile(`${file}.base`, await baseOf(base));
      else await rm(`${file}.base`, { force: true });
      await rename(part, file);
    } finally {
      await rm(part, { force: true });
    }
    return (await stat(file)).size;
  }

  /** Removes a state file and the note of the template it is a difference from. */
  private async removeState(file: string): Promise<void> {
    await rm(file, { force: true });
    await rm(`${file}.base`, { force: true });
  }

  async hibernate(id: string): Promise<HibernateOutcome> {
    const vm = this.running(id);
    const file = join(vm.dir, 'state');
    let bytes: number;
    try {
      bytes = await this.save(senderOf(vm.vmm), file, vm.tmpl);
    } catch (e) {
      await vm.vmm.qmp.cmd('cont').catch(() => {});
      await this.removeState(file);
      throw e;
    }
    const rss = rssOf(vm.vmm.proc.pid);
    const v: Vm = vm;
    v.hibernated = file;
    vm.agent.close();
    v.agent = undefined;
    await vm.vmm.qmp.cmd('quit').catch(() => {});
    await this.stopVmm(vm.vmm);
    v.vmm = undefined;
    for (const f of [...SOCKETS, 'qemu.pid']) await rm(f.endsWith('.sock') ? sockPath(vm.dir, f) : join(vm.dir, f), { force: true });
    this.startBlank(vm.tmpl);
    return { snapshotBytes: bytes, releasedBytes: rss };
  }

  /**
   * Runs a hibernated VM on in a blank VMM, whose directory becomes the VM's. The record moves there
   * once the state is loaded and before the guest runs: a node that dies before that finds the VM
   * hibernated in its old directory (the blank one, with no record, is removed); after it, running
   * in the new one (the old one, with no record, is removed).
   */
  async restore(id: string): Promise<void> {
    const vm = this.get(id);
    if (!vm.hibernated) throw new ProtocolError('INVALID_STATE', `sandbox ${id} is not hibernated`);
    const state = vm.hibernated;
    const was = vm.dir;
    const vmm = await this.takeBlank(vm.tmpl);
    let moved = false;
    try {
      vm.hibernated = undefined;
      await this.incoming(vm, vmm, state, async () => {
        await this.claim(vm, vmm.dir);
        moved = true;
        await rm(this.recordFile(was), { force: true });
      });
      // Taken up after a restart: its tap and rules went with the old run (egress recover).
      const policy = vm.renet;
      if (policy) {
        await this.setNetwork(id, policy);
        vm.renet = undefined;
      }
    } catch (e) {
      vm.hibernated = state;
      vm.agent?.close();
      vm.agent = undefined;
      vm.vmm = undefined;
      vm.dir = was;
      await this.stopVmm(vmm);
      // Its record back first: a directory without one is removed by recover.
      if (moved) {
        await this.writeRecord(vm);
        await rm(this.recordFile(vmm.dir), { force: true });
      }
      await removeVmDir(vmm.dir);
      throw e;
    }
    await this.removeState(state);
    await removeVmDir(was);
    this.startBlank(vm.tmpl);
  }

  async stats(id: string): Promise<SandboxStats> {
    const vm = this.get(id);
    const pid = vm.vmm?.proc.pid;
    if (!pid) return { memoryBytes: 0, cpuSec: 0 };
    const s: SandboxStats = { memoryBytes: rssOf(pid) };
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ');
    if (st) s.cpuSec = (Number(st[11]) + Number(st[12])) / 100;
    return s;
  }

  async destroy(id: string): Promise<void> {
    const vm = this.vms.get(id);
    if (!vm) return;
    vm.agent?.close();
    vm.relay?.kill('SIGKILL');
    await this.egress.remove(id);
    await this.stopVmm(vm.vmm);
    if (vm.dir) {
      await removeVmDir(vm.dir);
      await rm(this.recordFile(vm.dir), { force: true });
    }
    for (const r of vm.tmpl?.refs ?? []) this.o.layers.releaseFile(r);
    this.vms.delete(id);
  }

  // ─── Snapshotting ─────────────────────────────────────────────────────────────────────────

  async snapshot(id: string, opts: { name?: string; meta?: Record<string, unknown>; local?: boolean } = {}): Promise<{ snapshot: string; bytes: number }> {
    const vm = this.running(id);
    const name = opts.name ?? `${id}-${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
    if (!SNAPSHOT_NAME.test(name)) throw new ProtocolError('INVALID_REQUEST', `snapshot: bad name '${name}'`);
    const file = join(this.root, 'snapshots', `${name}.state`);
    if (existsSync(file)) throw new ProtocolError('ALREADY_EXISTS', `snapshot ${name} exists`);
    let bytes: number;
    try {
      bytes = await this.save(senderOf(vm.vmm), file, opts.local ? vm.tmpl : undefined);
      // The meta last: a state without it is a snapshot cut short (recover removes it).
      await writeFile(join(this.root, 'snapshots', `${name}.json`), JSON.stringify({ template: vm.tmpl.key, from: id, ...(opts.meta ? { meta: opts.meta } : {}) }));
    } catch (e) {
      await this.deleteSnapshot(name);
      throw e;
    } finally {
      await vm.vmm.qmp.cmd('cont').catch(() => {});
    }
    return { snapshot: name, bytes };
  }

  async restoreFrom(snapshot: string, newId: string, spec: SandboxSpec): Promise<void> {
    if (!SNAPSHOT_NAME.test(snapshot)) throw new ProtocolError('INVALID_REQUEST', `snapshot: bad name '${snapshot}'`);
    const meta = await readFile(join(this.root, 'snapshots', `${snapshot}.json`), 'utf8').catch(() => {
      throw new ProtocolError('NOT_FOUND', `no snapshot ${snapshot}`, { detail: { snapshot } });
    });
    const { template } = JSON.parse(meta) as { template: string };
    let tmpl = await [...this.templates.values()].reduce<Promise<Template | undefined>>(async (acc, t) => (await acc) ?? (await t.then((x) => (x.key === template ? x : undefined), () => undefined)), Promise.resolve(undefined));
    if (!tmpl) {
      // A node restarted since: the template of the spec's machine (on disk, or booted again). The
      // snapshot holds every page of its RAM, so a template booted anew serves as well.
      const { shape, refs, image } = await this.shapeOf(spec);
      try {
        tmpl = await this.template(shape, refs, image);
      } finally {
        for (const r of refs) this.o.layers.releaseFile(r);
      }
    }
    const want = { memoryMiB: spec.memoryMiB, cpus: Math.max(1, Math.ceil(spec.cpu)), diskMiB: diskMiBOf(spec) };
    const have = tmpl.shape;
    // QEMU loads a state only into the machine it was saved from.
    if (tmpl.key !== template || have.memoryMiB !== want.memoryMiB || have.cpus !== want.cpus || have.diskMiB !== want.diskMiB) {
      throw new ProtocolError('INVALID_SPEC', `snapshot ${snapshot} is of another machine (${have.memoryMiB} MiB, ${have.cpus} CPUs, a ${have.diskMiB} MiB disk, its image's layers): a sandbox made from it must ask for the same`, { detail: { field: 'fromSnapshot' } });
    }
    await this.create(newId, spec, { state: join(this.root, 'snapshots', `${snapshot}.state`), tmpl });
  }

  async fork(id: string, newId: string, spec: SandboxSpec): Promise<void> {
    const { snapshot } = await this.snapshot(id, { local: true });
    try {
      await this.restoreFrom(snapshot, newId, spec);
    } finally {
      await this.deleteSnapshot(snapshot);
    }
  }

  async listSnapshots(): Promise<Array<{ snapshot: string; bytes: number; meta?: Record<string, unknown> }>> {
    const dir = join(this.root, 'snapshots');
    const out: Array<{ snapshot: string; bytes: number; meta?: Record<string, unknown> }> = [];
    for (const f of await readdir(dir).catch(() => [] as string[])) {
      if (!f.endsWith('.json')) continue;
      const name = f.slice(0, -'.json'.length);
      const m = await readFile(join(dir, f), 'utf8').then((t) => JSON.parse(t) as { meta?: Record<string, unknown> }, () => undefined);
      const st = await stat(join(dir, `${name}.state`)).catch(() => undefined);
      if (!m || !st) continue;
      out.push({ snapshot: name, bytes: st.size, ...(m.meta ? { meta: m.meta } : {}) });
    }
    return out;
  }

  async deleteSnapshot(name: string): Promise<void> {
    if (!SNAPSHOT_NAME.test(name)) return;
    await this.removeState(join(this.root, 'snapshots', `${name}.state`));
    await rm(join(this.root, 'snapshots', `${name}.json`), { force: true });
    // Its copy in the store, if it was exported: nothing names the blob any more, the store's gc takes it.
    if (this.o.store && (await this.o.store.get(stateImage(name)).catch(() => null))) await this.o.store.remove(stateImage(name)).catch(() => {});
  }

  /**
   * The state file as a blob in the image store, under an image of its own (`vmstate-<name>`) so
   * the store keeps it until the snapshot is deleted. The machine is the template key: a node whose
   * template of the same spec differs (another kernel, agent or QEMU) cannot load it.
   */
  async exportSnapshot(name: string): Promise<StoredState> {
    const store = this.o.store;
    if (!store) throw new ProtocolError('UNAVAILABLE', 'this node was opened without an image store: its VM snapshots stay on it');
    const dir = join(this.root, 'snapshots');
    const meta = JSON.parse(await readFile(join(dir, `${name}.json`), 'utf8')) as { template: string };
    if (existsSync(join(dir, `${name}.state.base`))) throw new ProtocolError('INVALID_STATE', `snapshot ${name} holds only what differs from this node's template: it cannot be started elsewhere`);
    const ref = await store.pushLayer(join(dir, `${name}.state`));
    // Never run: an image only so that the store keeps the blob (a manifest must name an init).
    await store.put({ name: stateImage(name), layers: [ref], env: [], cwd: '/', user: { uid: 0, gid: 0 }, init: ['/vm-state'] });
    return { digest: ref.digest, size: ref.size, machine: meta.template };
  }

  /** Another node's exported snapshot, fetched whole through the layer cache into this node's snapshots. */
  async importSnapshot(name: string, state: StoredState): Promise<void> {
    if (!SNAPSHOT_NAME.test(name)) throw new ProtocolError('INVALID_REQUEST', `snapshot: bad name '${name}'`);
    const dir = join(this.root, 'snapshots');
    const ref: LayerRef = { digest: state.digest, size: state.size };
    // No chunk index given: the cache downloads it whole and checks it against its digest.
    const path = await this.o.layers.acquireFile(ref);
    try {
      await copyFile(path, join(dir, `${name}.state`));
      await chmod(join(dir, `${name}.state`), 0o644);
      await writeFile(join(dir, `${name}.json`), JSON.stringify({ template: state.machine, imported: true }));
    } catch (e) {
      await this.deleteSnapshot(name);
      throw e;
    } finally {
      this.o.layers.releaseFile(ref);
    }
  }

  // ─── node lifecycle ───────────────────────────────────────────────────────────────────────

  /** VMs the last recover took up from a previous run: hibernated, each with the spec it was made with. */
  kept(): Array<{ id: string; spec: SandboxSpec }> {
    return [...this.vms.values()].filter((v) => v.adopted).map((v) => ({ id: v.id, spec: v.spec }));
  }

  /**
   * A VM of a previous run, back under this backend, hibernated: a VMM still running (`pid`) is
   * saved first, as a hibernation would; one that is not must have its state on disk. A VMM that
   * runs and cannot be saved is not taken up from an older state file: that would bring back a
   * past the sandbox had moved on from (a restore whose old state the dead node had not yet removed).
   */
  private async takeUp(rec: VmRecord, dir: string, pid: number | undefined): Promise<void> {
    const state = join(dir, 'state');
    for (const f of await readdir(dir)) if (f.includes('.part-')) await rm(join(dir, f), { force: true });
    const { shape, refs, image } = await this.shapeOf(rec.spec);
    let tmpl: Template;
    try {
      tmpl = await this.template(shape, refs, image);
      if (tmpl.key !== rec.template) throw new Error(`its machine changed (template ${rec.template}, now ${tmpl.key}: another kernel, agent, QEMU or accelerator)`);
      await this.saveLeftRunning(dir, state, pid, tmpl);
      if (!existsSync(state)) throw new Error('no saved state');
    } catch (e) {
      for (const r of refs) this.o.layers.releaseFile(r);
      throw e;
    }
    for (const f of [...SOCKETS, 'qemu.pid']) await rm(f.endsWith('.sock') ? sockPath(dir, f) : join(dir, f), { force: true });
    const spec = rec.spec;
    const vm: Vm = { id: rec.id, dir, tmpl, ...this.processOf(spec, image), seq: 0, cpu: spec.cpu, pids: spec.pidsLimit, spec, hibernated: state, adopted: true };
    if (spec.network) vm.renet = spec.network;
    this.vms.set(rec.id, vm);
  }

  /** A VMM a previous run left running (`pid`), saved to `state` as a hibernation would save it; then it is ended. */
  private async saveLeftRunning(dir: string, state: string, pid: number | undefined, tmpl: Template): Promise<void> {
    if (pid !== undefined) {
      const qmp = await Qmp.open(sockPath(dir, 'qmp.sock'), 5_000);
      try {
        // A restore the node died in the middle of: the VMM has not run from the state yet, which
        // is therefore still the sandbox's latest. Any other VMM has run: its state is saved anew.
        const { status } = (await qmp.cmd('query-status')) as { status: string };
        if (status !== 'inmigrate') {
          // A hibernation or snapshot the node died in the middle of leaves QEMU paused as after a
          // migration, and QEMU refuses to migrate such a VM again ("paused due to previous
          // migration") until it has run: a moment's `cont`, then the save stops it again.
          if (status === 'postmigrate') await qmp.cmd('cont');
          await this.save({ pid, uid: (await stat(dir)).uid, qmp }, state, tmpl);
          await qmp.cmd('quit').catch(() => {});
        }
      } finally {
        qmp.close();
        await killAndWait(pid);
      }
    }
  }

  async recover(): Promise<string[]> {
    const ids: string[] = [];
    const vmsDir = join(this.root, 'vms');
    for (const d of await readdir(vmsDir).catch(() => [] as string[])) {
      const dir = join(vmsDir, d);
      if ([...this.vms.values()].some((v) => v.dir === dir)) continue;
      const meta = await readFile(join(dir, 'meta.json'), 'utf8').then((t) => JSON.parse(t) as { id: string }, () => null);
      const rec = await readFile(this.recordFile(dir), 'utf8').then((t) => JSON.parse(t) as VmRecord, () => null);
      const pid = Number((await readFile(join(dir, 'qemu.pid'), 'utf8').catch(() => '')).trim());
      const ours = pid > 0 && alive(pid) && (await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).includes(dir);
      if (rec && !this.vms.has(rec.id)) {
        try {
          await this.takeUp(rec, dir, ours ? pid : undefined);
          continue;
        } catch (err) {
          this.o.log?.warn({ err, sandbox: rec.id }, `${this.kind}: a VM the previous run left could not be taken up: removed`);
        }
      }
      if (ours) await killAndWait(pid);
      await removeVmDir(dir);
      await rm(this.recordFile(dir), { force: true });
      if (meta?.id) ids.push(meta.id);
    }
    // Records whose VM directory is gone (removed between the two).
    for (const f of await readdir(join(this.root, 'records')).catch(() => [] as string[])) {
      if (!existsSync(join(vmsDir, f.replace(/\.json(\.tmp)?$/, '')))) await rm(join(this.root, 'records', f), { force: true });
    }
    // Snapshots cut short (a state without its meta, or the other way round); whole ones stay.
    const snaps = join(this.root, 'snapshots');
    const files = new Set(await readdir(snaps).catch(() => [] as string[]));
    for (const f of files) {
      if (f.startsWith('.saving-')) {
        await rm(join(snaps, f), { recursive: true, force: true });
        continue;
      }
      const [base, ext] = [f.replace(/\.(state|json)$/, ''), f.endsWith('.state') ? '.json' : '.state'];
      if (!files.has(`${base}${ext}`)) await rm(join(snaps, f), { force: true });
    }
    // Cgroups of VMMs that outlived a node killed with SIGKILL, and what still runs in them.
    await this.jail.recover();
    await this.egress.recover();
    // Templates whose boot was cut short.
    for (const d of await readdir(join(this.root, 'templates')).catch(() => [] as string[])) {
      if (d.includes('.tmp-')) await removeVmDir(join(this.root, 'templates', d));
    }
    return ids;
  }

  async close(): Promise<void> {
    this.closed = true;
    const waiting = [...[...this.blank.values()].map((p) => p.then((b) => b.vmm)), ...[...this.spare.values()].flat()];
    this.blank.clear();
    this.spare.clear();
    await Promise.all(waiting.map(async (p) => this.discard(await p.catch(() => undefined))));
    await Promise.all([...this.vms.keys()].map((id) => this.destroy(id)));
    await this.egress.close();
    await this.jail.close();
    this.ramhold?.close();
  }
}

/**
 * A booted template becomes the node's before clones use it: its device state readable (the node
 * sends it to each clone), the rest (its RAM, which clones open as root before the drop) root's
 * alone. QEMU's user wrote some of it and may be reused.
 */
async function shareReadOnly(dir: string): Promise<void> {
  for (const f of await readdir(dir)) {
    await chown(join(dir, f), 0, 0);
    await chmod(join(dir, f), f === 'dev' ? 0o644 : 0o600);
  }
  await chown(dir, 0, 0);
  await chmod(dir, 0o755);
}

const NETRELAY_SOURCE = sourceFile('runtime/microvm/netrelay.c');
/**
 * Part of every template's key: a template made before revision 2 may have had holes punched in
 * its RAM by its clones (vmm-exec.c), so none is used again; each machine boots anew once.
 */
const TEMPLATE_REVISION = 2;

/**
 * The guest kernel's command line, but for what the shape and the host add; part of a template's
 * key (a clone must boot nothing, it resumes the template's kernel as it was). No lockup watchdogs:
 * their timers woke every idle guest, and under TCG each wake-up costs host CPU. Nor the two timers
 * that were left (traced in a guest): kcompactd's proactive compaction check every 500 ms, and
 * vmstat's shepherd every second (which also lets the deferrable timers queued behind them run).
 * Compaction on demand stays; the per-CPU counters are folded every 30 s, or at once past their
 * small thresholds. Measured over 10 idle VMs for 20 s: 38 → ~1 context switches a second per
 * QEMU, 0.33% → under 0.05% of a core.
 */
const GUEST_ARGS = ['console=ttyS0', 'quiet', 'panic=-1', 'rdinit=/init', 'random.trust_cpu=on', 'nowatchdog', 'nmi_watchdog=0', 'sysctl.vm.compaction_proactiveness=0', 'sysctl.vm.stat_interval=30'];
/**
 * Under TCG, no clocksource watchdog checking the TSC twice a second either: TCG's TSC is QEMU's,
 * counted from the host's monotonic clock. (`tsc_early_khz`, measured on the host, is not in the
 * key: it may differ by a few kHz from one start of the node to the next.)
 */
const TCG_GUEST_ARGS = ['tsc=reliable'];

const VMDIFF_SOURCE = sourceFile('runtime/microvm/vmdiff.c');
const VMM_EXEC_SOURCE = sourceFile('runtime/microvm/vmm-exec.c');
const RAMHOLD_SOURCE = sourceFile('runtime/microvm/ramhold.c');

/** The RAM block of guest memory: the memory backend's id (start's `-object memory-backend-file,id=mem`). */
const RAM_BLOCK = 'mem';

/**
 * Which template RAM file a state saved as a difference was taken against: the file as it is on
 * disk (a template is never changed once saved, only made again if its directory went).
 */
async function baseOf(tmpl: Template): Promise<string> {
  const s = await stat(join(tmpl.dir, 'mem'));
  return `${s.ino}:${s.size}:${Math.round(s.mtimeMs)}`;
}

/** The store image that keeps an exported snapshot's state. */
const stateImage = (name: string) => `vmstate-${name}`;

function lastLines(file: string): string {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').slice(-3).join(' | ');
  } catch {
    return '';
  }
}

function rssOf(pid: number | undefined): number {
  if (!pid) return 0;
  try {
    const m = /^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([p, new Promise<never>((_, reject) => (t = setTimeout(() => reject(new ProtocolError('BACKEND_FAILED', `microvm: ${what} within ${ms} ms`)), ms)))]).finally(() => clearTimeout(t));
}

/** VGA memory for a screen at 32 bits per pixel, with room for a second buffer, in MiB QEMU accepts (a power of two, 1–256). */
function vgaMiB(s: ScreenSize): number {
  const need = Math.ceil((s.width * s.height * 4 * 2) / (1024 * 1024));
  let m = 4;
  while (m < need) m *= 2;
  return Math.min(m, 256);
}

/** The VMM's QEMU has not exited. */
function vmmRuns(v: Vmm): boolean {
  return v.proc.exitCode === null && v.proc.signalCode === null;
}
