/**
 * The FnCall service of a node: runs each invocation in a fresh process tree of a warm pool
 * member, compiles when the language needs it, judges tests, and gives the member back to be made
 * fresh again. actors/fncall-host.ts binds it to `pdk.v1.fn.invoke`.
 */
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import type { Logger } from 'pino';
import { type FnInvoke, type FnInvokeResult, type FnLanguage, FnLanguages, type FnRunResult, Limits, ProtocolError, validateSpec } from '../../protocol/index.ts';
import { mounts } from '../cgroups.ts';
import type { FnConfig } from '../config.ts';
import type { ContainerBackend } from '../container/backend.ts';
import type { NodeImages } from '../images/node-images.ts';
import { ImageStore } from '../images/store.ts';
import { run } from '../proc.ts';
import { aggregate, judgeRun, previewOf } from './judge.ts';
import { ensureLanguageImages, LANGUAGES, type Language, WORK } from './languages.ts';
import type { Member, RunLimits } from './member.ts';
import { Pools } from './pool.ts';
import { buildRunner } from './runner.ts';

/** Compiles get their own, roomier limits: a compiler is not the program under judgement. */
const COMPILE_LIMITS: RunLimits = { timeMs: 30_000, wallMs: 60_000, memoryMiB: 1024, outputBytes: 64 * 1024 };
const RECYCLE_AFTER = 5000;
const IDLE_MS = 60_000;

/** How one FnCall image stands on a node that builds it (node.info `fnImages`). */
export interface FnImageState {
  state: 'building' | 'ready' | 'failed';
  startedAt?: number;
  /** Time still to go, estimated from this host's last build of the image. */
  etaMs?: number;
  error?: string;
}

/** First builds with no measurement yet: a debootstrap of bookworm minbase plus packages here took 3–5 min. */
const FIRST_BUILD_ESTIMATE_MS = 300_000;
const COPY_ESTIMATE_MS = 30_000;

export class FnService {
  private pools?: Pools;
  private readonly dir: string;
  private readonly building = new Map<string, FnImageState & { estimateMs: number }>();
  private stopped = false;
  private planned?: Promise<void>;

  constructor(
    /** `maxPayload`: the largest message the node may publish; bounds a result's output. */
    private readonly o: { maxPayload: number; backend: ContainerBackend; images: NodeImages; cfg: FnConfig; nodeId: string; nodeDir: string; log: Logger },
  ) {
    this.dir = join(o.nodeDir, 'fncall');
  }

  async start(): Promise<void> {
    await this.recover();
    const runner = await buildRunner(this.o.cfg.runnerDir);
    const warm: Record<string, number> = {};
    for (const [name, n] of Object.entries(this.o.cfg.pool)) {
      const image = (LANGUAGES as Record<string, Language | undefined>)[name]?.image ?? name;
      warm[image] = Math.max(warm[image] ?? 0, n);
    }
    const pools = new Pools(
      { warm, max: this.o.cfg.maxMembers, queue: this.o.cfg.queue, recycleAfter: RECYCLE_AFTER, idleMs: IDLE_MS },
      { backend: this.o.backend, runner, dir: this.dir, diskMiB: this.o.cfg.diskMiB, pidsLimit: this.o.cfg.pidsLimit },
      (image) => this.manifest(image),
      this.o.log,
      (m) => this.warmUp(m),
    );
    pools.start(this.o.cfg.prewarm);
    this.pools = pools;
  }

  /**
   * The images the languages need, made in the background when this node's own store lacks them:
   * copied from `copyFrom` (the host's default store) when it has them, else built (minutes).
   * Until one is there, invocations of its languages are refused with how long is left.
   */
  buildImages(o: { imagesDir: string; copyFrom: string[] }): void {
    // What is missing and how long each takes is known after a few reads; invocations that arrive
    // before that wait for it (see invoke) rather than hear that nothing is being made.
    const planned = (async () => {
      const have = await this.o.images.list();
      const missing = ['python', 'gcc'].filter((i) => !have.includes(i));
      const times = await this.buildTimes();
      const copyable = await Promise.all(missing.map((m) => Promise.all(o.copyFrom.map((d) => new ImageStore(d).get(m).catch(() => null))).then((r) => r.some(Boolean))));
      missing.forEach((image, i) => {
        this.building.set(image, { state: 'building', estimateMs: copyable[i] ? COPY_ESTIMATE_MS : (times[image] ?? FIRST_BUILD_ESTIMATE_MS) });
      });
      return { missing, copyable };
    })();
    this.planned = planned.then(
      () => {},
      () => {},
    );
    void (async () => {
      const { missing, copyable } = await planned;
      if (missing.length === 0) return;
      const store = new ImageStore(o.imagesDir);
      for (const image of missing) {
        // stop() may have run while the previous image was made.
        if (this.isStopped()) return;
        const st = this.building.get(image) as FnImageState & { estimateMs: number };
        st.startedAt = Date.now();
        this.o.log.info({ image, progress: true }, `FnCall: making the '${image}' image in the background (about ${Math.round(st.estimateMs / 1000)} s); fn calls of its languages wait for it`);
        try {
          await ensureLanguageImages(store, { which: [image], progress: this.progressLog(image), copyFrom: o.copyFrom });
          const ms = Date.now() - st.startedAt;
          this.building.set(image, { state: 'ready', estimateMs: 0 });
          if (!copyable[missing.indexOf(image)]) await this.saveBuildTime(image, ms);
          this.o.log.info({ image, ms, progress: true }, `FnCall: the '${image}' image is ready (${Math.round(ms / 1000)} s)`);
        } catch (err) {
          this.building.set(image, { state: 'failed', estimateMs: 0, error: (err as Error).message.slice(0, 500) });
          this.o.log.warn({ image, error: (err as Error).message.slice(0, 2000), progress: true }, `FnCall: the '${image}' image could not be made; 'paddock fn build' tries again`);
        }
      }
    })();
  }

  /** Build progress (a line every few seconds) as log lines `paddock up` shows. */
  private progressLog(image: string): Writable {
    let buf = '';
    return new Writable({
      write: (chunk: Buffer, _enc, done) => {
        buf += chunk.toString();
        const lines = buf.split('\n');
        buf = lines.pop() ?? '';
        for (const l of lines) if (l.trim()) this.o.log.info({ image, progress: true }, `FnCall image ${l.trim()}`);
        done();
      },
    });
  }

  private buildTimesFile(): string {
    return join(this.o.cfg.runnerDir, 'image-build-ms.json');
  }

  private async buildTimes(): Promise<Record<string, number>> {
    try {
      return JSON.parse(await readFile(this.buildTimesFile(), 'utf8')) as Record<string, number>;
    } catch {
      return {};
    }
  }

  private async saveBuildTime(image: string, ms: number): Promise<void> {
    try {
      await mkdir(this.o.cfg.runnerDir, { recursive: true });
      await writeFile(this.buildTimesFile(), JSON.stringify({ ...(await this.buildTimes()), [image]: ms }));
    } catch {
      // Only an estimate for the next first start is lost.
    }
  }

  /** How each image this node makes stands (only those it had to make). */
  imageStates(): Record<string, FnImageState> {
    const out: Record<string, FnImageState> = {};
    for (const [image, s] of this.building) {
      const { estimateMs, ...rest } = s;
      out[image] = s.state === 'building' ? { ...rest, etaMs: this.etaMs(image) } : rest;
    }
    return out;
  }

  /** Until `image` is there: what is left of the builds before it (one at a time, in order) and of its own. */
  private etaMs(image: string): number {
    let total = 0;
    for (const [name, s] of this.building) {
      if (s.state !== 'building') continue;
      const elapsed = s.startedAt === undefined ? 0 : Date.now() - s.startedAt;
      // A build past its estimate still has a little to go.
      total += Math.max(10_000, s.estimateMs - elapsed);
      if (name === image) break;
    }
    return total;
  }

  /** Scratch directories of members of a previous run (their containers are the backend's to recover). */
  private async recover(): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    for (const name of await readdir(this.dir)) {
      const d = join(this.dir, name);
      if (mounts().some((m) => m.target === d)) await run('umount', ['-l', d], { allowFail: true });
      await rm(d, { recursive: true, force: true });
    }
  }

  private async manifest(image: string) {
    try {
      return await this.o.images.forSpec(validateSpec({ image }));
    } catch (e) {
      if (e instanceof ProtocolError && e.code === 'INVALID_SPEC') return null;
      throw e;
    }
  }

  /**
   * Runs each language of the member's image once (python imports a few modules, gcc compiles a
   * line): the first real call then finds the runtime's files in the page cache instead of
   * fetching them from the layer store.
   */
  private async warmUp(m: Member): Promise<void> {
    const env = this.envOf(m, { env: {} });
    for (const lang of Object.values(LANGUAGES)) {
      if (lang.image !== m.image) continue;
      const o = await m.run({ argv: lang.warm, env, stdin: new Uint8Array(0), limits: COMPILE_LIMITS });
      if (o.exitCode !== 0) this.o.log.warn({ member: m.id, argv: lang.warm, exitCode: o.exitCode, stderr: o.stderr.toString().slice(0, 500) }, 'FnCall warm-up failed');
      await m.reset();
    }
  }

  /** Languages whose image is among `images` (the node's, for its record in pdk_nodes). */
  languages(images: string[]): FnLanguage[] {
    return FnLanguages.filter((l) => images.includes(LANGUAGES[l].image));
  }

  get load(): { running: number; queued: number } {
    return this.pools?.load ?? { running: 0, queued: 0 };
  }

  stats() {
    return this.pools?.stats() ?? {};
  }

  async invoke(req: FnInvoke): Promise<FnInvokeResult> {
    const lang = req.language ? LANGUAGES[req.language] : undefined;
    const image = lang?.image ?? (req.image as string);
    // `ready`: made a moment ago, after the node's image list (kept a second) was read.
    if (lang && this.building.get(image)?.state !== 'ready' && !(await this.o.images.list()).includes(image)) {
      await this.planned;
      const b = this.building.get(image);
      if (b?.state === 'building') {
        const etaMs = this.etaMs(image);
        throw new ProtocolError('UNAVAILABLE', `${req.language} runs in the '${image}' image, which node ${this.o.nodeId} is still making (its first start): about ${Math.ceil(etaMs / 1000)} s left`, { detail: { image, etaMs } });
      }
      if (b?.state === 'ready') return this.invoke(req);
      const why = b?.state === 'failed' ? `, and could not make it (${b.error})` : '';
      throw new ProtocolError('UNAVAILABLE', `${req.language} runs in the '${image}' image, which node ${this.o.nodeId} does not have${why}; build it with 'paddock fn build'`, { detail: { image } });
    }
    const pools = this.pools;
    if (!pools) throw new ProtocolError('UNAVAILABLE', 'FnCall is starting');
    const asked = performance.now();
    const m = await pools.acquire(image);
    const queuedMs = Math.round((performance.now() - asked) * 1000) / 1000;
    let broken = false;
    try {
      return { ...(await this.runIn(m, req, lang)), node: this.o.nodeId, queuedMs };
    } catch (e) {
      broken = true;
      throw e;
    } finally {
      pools.release(m, broken);
    }
  }

  private async runIn(m: Member, req: FnInvoke, lang: Language | undefined): Promise<Omit<FnInvokeResult, 'node' | 'queuedMs'>> {
    const env = this.envOf(m, req);
    const limits: RunLimits = { ...req.limits, outputBytes: Math.min(req.limits.outputBytes, this.replyRoom()) };
    const out: Omit<FnInvokeResult, 'node' | 'queuedMs'> = { verdict: 'OK', exitCode: 0, stdout: new Uint8Array(0), stderr: new Uint8Array(0), timeMs: 0, wallMs: 0, memoryBytes: 0 };
    if (req.code) m.putBox(lang?.file ?? 'main', req.code, lang ? 0o644 : 0o755);
    m.putWork(req.files);
    let fresh = true;
    if (lang?.compile) {
      const c = await m.run({ argv: lang.compile, env, stdin: new Uint8Array(0), limits: COMPILE_LIMITS });
      const judged = judgeRun(c, COMPILE_LIMITS, undefined, 'exact', this.o.cfg.pidsLimit);
      const text = Buffer.concat([c.stdout, c.stderr]);
      if (text.length > 0) out.compileOutput = text;
      if (judged.verdict !== 'OK' || !m.promote('main')) {
        const why = judged.verdict === 'RUNTIME_ERROR' ? `the compiler failed (exit code ${c.exitCode})` : (judged.reason ?? 'the compiler wrote no program').replace('the program', 'the compiler');
        return { ...out, verdict: 'COMPILE_ERROR', exitCode: c.exitCode, timeMs: judged.timeMs, wallMs: judged.wallMs, memoryBytes: judged.memoryBytes, reason: why };
      }
      fresh = false;
    }
    const argv = lang ? [...lang.run, ...req.args] : [...(req.command ?? []), ...req.args];
    const tests = req.tests ?? [{ stdin: req.stdin }];
    const results: FnRunResult[] = [];
    for (const test of tests) {
      if (!fresh) {
        await m.reset(true);
        m.putWork(req.files);
      }
      fresh = false;
      const o = await m.run({ argv, env, stdin: test.stdin, limits });
      const r = judgeRun(o, limits, 'expected' in test ? test.expected : undefined, req.compare, this.o.cfg.pidsLimit);
      results.push(r);
      if (req.stopOnFailure && r.verdict !== 'OK') break;
    }
    if (!req.tests) return { ...out, ...(results[0] as FnRunResult) };
    const total = aggregate(results);
    // Previews of every test fit beside the main output in one reply.
    const preview = Math.min(Limits.fn.testPreviewBytes, Math.floor(this.replyRoom() / (2 * results.length)));
    return { ...out, ...total, tests: results.map((r) => previewOf(r, preview)) };
  }

  /** The image's environment, then the program's place in the member, then the caller's. */
  private envOf(m: Member, req: Pick<FnInvoke, 'env'>): Record<string, string> {
    const env: Record<string, string> = {};
    for (const kv of m.manifest.env) {
      const i = kv.indexOf('=');
      if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
    }
    return { ...env, HOME: WORK, TMPDIR: '/tmp', ...req.env };
  }

  /** Output that still fits one NATS reply with room for the rest of the result. */
  private replyRoom(): number {
    const max = this.o.maxPayload;
    return Math.max(1024, Math.floor(max / 2) - 64 * 1024);
  }

  private isStopped(): boolean {
    return this.stopped;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.pools?.stop();
  }
}
