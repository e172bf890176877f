/**
 * The full-VM backend: a desktop in QEMU for GUI and browser agents. It is the microVM backend
 * (the same guest agent, templates, clones, hibernate, snapshots, fork and cleanup) on a q35
 * machine with QEMU's VGA, a virtio keyboard and a virtio tablet, booting Debian's standard
 * kernel (bochs DRM, virtio-input). Each template starts the image's desktop (its init, e.g.
 * the `desktop` image's X server and window manager) once and waits until it is drawn, so every
 * clone starts with the desktop already on its screen.
 *
 * The screen is read through QMP (`screendump`, PNG) and input goes through QMP
 * (`input-send-event`): nothing in the guest takes part, so an agent that kills its X server
 * still gets screenshots (of what is left) and cannot forge or block the harness's input path.
 */
import { randomBytes } from 'node:crypto';
import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { type ComputerAction, Limits, ProtocolError, type SandboxSpec } from '../../protocol/index.ts';
import type { Display } from '../backend.ts';
import type { ImageManifest } from '../images/store.ts';
import { MicrovmBackend, type MicrovmBackendOptions, type ScreenSize, sockPath, withTimeout } from '../microvm/backend.ts';
import type { AgentChannel } from '../microvm/channel.ts';
import { moveTo, type Pointer, plan, type QmpInput } from './input.ts';
import { ViewServer } from './view.ts';

/** How long a template's desktop may take to draw under TCG (Xorg and a window manager: ~10–30 s). */
const DESKTOP_READY_MS = 180_000;
const READY_FILE = '/tmp/.paddock-desktop/ready';
/**
 * Between two input commands: virtio-input hands events to the guest through a ring of 64
 * buffers, and QEMU drops what does not fit, so a burst (a long `type`) must let the guest drain.
 */
const PACE_MS = 6;
/** How long a VM just started or restored may take before its X server sees input from the VMM. */
const INPUT_SETTLE_MS = 20_000;
/**
 * A Num Lock toggle not seen by X after this is taken as lost and sent again. Keys sent in the
 * first moments after a restore do not arrive (a toggle sent at once showed only after ~2 s or
 * never; sent again every 0.6 s, toggles came in late and undid each other): a longer wait costs
 * nothing on the create path, which does not wait for the probe.
 */
const TOGGLE_LOST_MS = 2_000;

interface Screen {
  size: ScreenSize;
  pointer: Pointer;
  /** Actions in flight or queued: one at a time, in order, at most Limits.display.queueMax. */
  queue: Promise<unknown>;
  queued: number;
  /** Settles once the guest's X server sees input from the VMM (inputSettled); actions wait for it, screenshots do not. */
  input: Promise<void>;
}

export class FullvmBackend extends MicrovmBackend implements Display {
  override readonly kind = 'fullvm' as const;
  private readonly screens = new Map<string, Screen>();
  private readonly viewer: ViewServer;

  constructor(o: Omit<MicrovmBackendOptions, 'machine'> & { view?: { host: string; port: number } }) {
    super({ ...o, machine: 'q35' }, 'fullvm');
    this.viewer = new ViewServer(o.view);
  }

  /** Every VMM's display is also a VNC server on a socket of its own, for the live view (view.ts). */
  protected override extraArgs(dir: string): string[] {
    return ['-vnc', `unix:${sockPath(dir, 'vnc.sock')}`];
  }

  protected override screenOf(spec: SandboxSpec): ScreenSize {
    return { width: spec.display?.width ?? Limits.display.width, height: spec.display?.height ?? Limits.display.height };
  }

  protected override async prepareTemplate(agent: AgentChannel, image: ImageManifest, dir: string): Promise<void> {
    const init = image.init ?? [];
    // An image that only idles has no desktop: the screen shows the kernel's console.
    if (!init.length || (init[0] === '/bin/sleep' && init.length <= 2)) return;
    const run = (cmd: string[]) =>
      new Promise<number>((resolve) => {
        agent.exec(cmd, image.env, '/', { out: () => {}, err: () => {}, exit: resolve });
      });
    const quoted = init.map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ');
    await run(['/bin/sh', '-c', `setsid ${quoted} </dev/null >/dev/null 2>&1 &`]);
    const deadline = Date.now() + DESKTOP_READY_MS;
    while ((await run(['/bin/test', '-e', READY_FILE])) !== 0) {
      if (Date.now() > deadline) {
        throw new ProtocolError('BACKEND_FAILED', `fullvm: the desktop of image ${image.name} was not ready within ${DESKTOP_READY_MS / 1000} s (${READY_FILE}; console: ${join(dir, 'console.log')})`);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  }

  override async create(id: string, spec: SandboxSpec, from?: Parameters<MicrovmBackend['create']>[2]): Promise<void> {
    await super.create(id, spec, from);
    const size = this.screenOf(spec);
    const screen: Screen = { size, pointer: { x: Math.floor(size.width / 2), y: Math.floor(size.height / 2) }, queue: Promise.resolve(), queued: 0, input: Promise.resolve() };
    this.screens.set(id, screen);
    screen.input = this.settleInput(id);
  }

  override async restore(id: string): Promise<void> {
    await super.restore(id);
    this.screen(id).input = this.settleInput(id);
  }

  /** inputSettled in the background: a sandbox that goes away meanwhile ends it, with nothing to report. */
  private settleInput(id: string): Promise<void> {
    return this.inputSettled(id).catch((err: unknown) => {
      if (this.screens.has(id)) this.o.log?.warn({ id, err }, 'fullvm: input probe failed');
    });
  }

  /**
   * Until the guest's X server sees input from both of the VMM's devices. A VM just started from its
   * template (or restored) lost a key sent at once: in every try on a quiet machine, and under load
   * even after a pointer move had been seen. So after create and restore a probe goes through
   * each, and display actions wait until it has arrived (screenshots and exec do not): the pointer
   * moved beside where it is, and Num Lock toggled (read back with `xset q`), both then put back. A toggle cannot be sent twice blindly, so one that has not shown after
   * a while is taken as lost and sent again. An image without X (no xdotool, no display) has
   * nothing to wait for.
   */
  private async inputSettled(id: string): Promise<void> {
    const s = this.screen(id);
    const vm = this.running(id);
    const read = async () => {
      const r = await this.exec(id, { cmd: ['/bin/sh', '-c', 'xdotool getmouselocation && xset q'], env: { DISPLAY: ':0' }, timeoutMs: 5000, maxOutputBytes: 65536 });
      if (r.exitCode !== 0) return undefined;
      const out = r.stdout.toString();
      const at = /^x:(\d+) y:(\d+) /.exec(out);
      return { x: Number(at?.[1]), y: Number(at?.[2]), numLock: /Num Lock:\s+on/.test(out) };
    };
    const before = await read();
    if (!before) return;
    const toggle: QmpInput[] = [true, false].map((down) => ({ type: 'key', data: { down, key: { type: 'qcode', data: 'num_lock' } } }));
    const t0 = Date.now();
    const reach = async (to: Pointer, numLock: boolean): Promise<boolean> => {
      let toggledAt = 0;
      while (Date.now() - t0 < INPUT_SETTLE_MS) {
        const now = await read();
        if (now && now.x === to.x && now.y === to.y && now.numLock === numLock) return true;
        // The pointer is absolute: sending it again costs nothing. The toggle only once taken as lost.
        const events: QmpInput[] = moveTo(to, s.size);
        if (now?.numLock !== numLock && Date.now() - toggledAt > TOGGLE_LOST_MS) {
          events.push(...toggle);
          toggledAt = Date.now();
        }
        await vm.vmm.qmp.cmd('input-send-event', { events });
        await new Promise((r) => setTimeout(r, 50));
      }
      return false;
    };
    const probe = { x: s.pointer.x > 0 ? s.pointer.x - 1 : 1, y: s.pointer.y };
    const ok = (await reach(probe, !before.numLock)) && (await reach(s.pointer, before.numLock));
    if (ok) this.o.log?.debug({ id, ms: Date.now() - t0 }, 'fullvm: input arrives');
    else this.o.log?.warn({ id }, `fullvm: X did not see input from the VMM within ${INPUT_SETTLE_MS / 1000} s`);
  }

  override async destroy(id: string): Promise<void> {
    this.screens.delete(id);
    this.viewer.revoke(id);
    await super.destroy(id);
  }

  override async close(): Promise<void> {
    await this.viewer.close();
    await super.close();
  }

  /** A loopback URL of a page that shows the screen live (noVNC; `${url}/ws` is the RFB WebSocket); read-only unless `control`. */
  async view(id: string, control: boolean): Promise<{ url: string; control: boolean }> {
    const vm = this.get(id);
    return { url: await this.viewer.url(id, sockPath(vm.dir, 'vnc.sock'), control), control };
  }

  private screen(id: string): Screen {
    const s = this.screens.get(id);
    if (!s) throw new ProtocolError('NOT_FOUND', `no sandbox ${id} on this backend`);
    return s;
  }

  /** One at a time per sandbox, in the order asked; past the queue's bound, BUSY at once. */
  private serial<R>(id: string, fn: () => Promise<R>): Promise<R> {
    const s = this.screen(id);
    if (s.queued >= Limits.display.queueMax) {
      throw new ProtocolError('BUSY', `sandbox ${id} has ${s.queued} display actions queued (at most ${Limits.display.queueMax}): wait for their replies`, { detail: { queued: s.queued } });
    }
    s.queued++;
    const p = s.queue.then(fn, fn);
    s.queue = p.then(
      () => {},
      () => {},
    );
    return p.finally(() => s.queued--);
  }

  async screenshot(id: string): Promise<{ png: Uint8Array; width: number; height: number }> {
    return this.serial(id, () => this.grab(id));
  }

  private async grab(id: string): Promise<{ png: Uint8Array; width: number; height: number }> {
    const vm = this.running(id);
    // The VM's directory is on the node's run tmpfs: the round trip through a file stays in memory.
    // QEMU names it from inside its chroot, which is that directory (jail.ts).
    const name = `screen-${randomBytes(4).toString('hex')}.png`;
    const file = join(vm.vmm.dir, name);
    try {
      await withTimeout(vm.vmm.qmp.cmd('screendump', { filename: `/${name}`, format: 'png' }), 10_000, 'screendump');
      const png = await readFile(file);
      if (png.length < 24 || png.readUInt32BE(0) !== 0x89504e47) throw new ProtocolError('BACKEND_FAILED', 'fullvm: screendump wrote no PNG');
      return { png, width: png.readUInt32BE(16), height: png.readUInt32BE(20) };
    } finally {
      await rm(file, { force: true });
    }
  }

  async act(id: string, action: ComputerAction): Promise<{ cursor: { x: number; y: number } }> {
    const s = this.screen(id);
    return this.serial(id, async () => {
      await s.input;
      const vm = this.running(id);
      const { steps, pointer } = plan(action, s.pointer, s.size);
      for (const st of steps) {
        if ('sleepMs' in st) await new Promise((r) => setTimeout(r, st.sleepMs));
        else {
          await vm.vmm.qmp.cmd('input-send-event', { events: st.events });
          await new Promise((r) => setTimeout(r, PACE_MS));
        }
      }
      s.pointer = pointer;
      return { cursor: { ...pointer } };
    });
  }
}
