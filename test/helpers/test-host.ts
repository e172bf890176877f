/**
 * A destination for egress policies that never leaves the machine: a network namespace of its own
 * on 100.96.<k>.2, reached from the host over a veth, serving `solution\n` over HTTP (busybox
 * httpd) on the ports asked for. `k` comes from the process id, so test files in parallel workers
 * get hosts of their own.
 */
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const sh = promisify(execFile);

export class TestHost {
  private readonly servers: Array<() => void> = [];
  private webDir = '';

  private constructor(
    readonly addr: string,
    readonly gw: string,
    private readonly ns: string,
    private readonly hostIf: string,
  ) {}

  static async start(ports: number[]): Promise<TestHost> {
    const k = (process.pid % 250) + 1;
    const h = new TestHost(`100.96.${k}.2`, `100.96.${k}.1`, `pdkt${process.pid}`, `tph${process.pid}`);
    const peer = `tpg${process.pid}`;
    try {
      await sh('ip', ['netns', 'add', h.ns]);
      await sh('ip', ['link', 'add', h.hostIf, 'type', 'veth', 'peer', 'name', peer, 'netns', h.ns]);
      await sh('ip', ['addr', 'add', `${h.gw}/30`, 'dev', h.hostIf]);
      await sh('ip', ['link', 'set', h.hostIf, 'up']);
      for (const c of [['link', 'set', 'lo', 'up'], ['addr', 'add', `${h.addr}/30`, 'dev', peer], ['link', 'set', peer, 'up'], ['route', 'add', 'default', 'via', h.gw]]) await sh('ip', ['-n', h.ns, ...c]);
      h.webDir = await mkdtemp(join(tmpdir(), 'paddock-web-'));
      await writeFile(join(h.webDir, 'index.html'), 'solution\n');
      for (const port of ports) {
        const p = spawn('ip', ['netns', 'exec', h.ns, 'busybox', 'httpd', '-f', '-p', `${h.addr}:${port}`, '-h', h.webDir], { stdio: 'ignore' });
        h.servers.push(() => p.kill('SIGKILL'));
      }
      await new Promise((r) => setTimeout(r, 200));
      return h;
    } catch (e) {
      await h.stop();
      throw e;
    }
  }

  async stop(): Promise<void> {
    for (const kill of this.servers) kill();
    await sh('ip', ['link', 'del', this.hostIf]).catch(() => {});
    await sh('ip', ['netns', 'del', this.ns]).catch(() => {});
    if (this.webDir) await rm(this.webDir, { recursive: true, force: true });
  }
}
