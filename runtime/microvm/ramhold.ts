/**
 * The node's side of ramhold.c: one process per backend that maps each template's RAM file (why:
 * ramhold.c). Started on the first hold and again if it dies, holding again what it held.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

export class RamHold {
  private proc?: ChildProcess;
  /** What it maps: mapped again by a holder started after one that died. */
  private readonly held = new Set<string>();
  private waiting: Array<{ resolve: () => void; reject: (e: Error) => void }> = [];
  private closed = false;

  constructor(private readonly bin: string) {}

  /** Maps `file` whole for as long as the node runs; resolves once it is read in. */
  hold(file: string): Promise<void> {
    if (this.closed) return Promise.reject(new Error('ramhold: closed'));
    if (file.includes('\n')) return Promise.reject(new Error(`ramhold: a path with a newline: ${JSON.stringify(file)}`));
    return this.ask(file).then(() => {
      this.held.add(file);
    });
  }

  private ask(file: string): Promise<void> {
    const p = this.proc ?? this.start();
    return new Promise<void>((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      p.stdin?.write(`${file}\n`);
    });
  }

  private start(): ChildProcess {
    const p = spawn(this.bin, [], { stdio: ['pipe', 'pipe', 'ignore'] });
    this.proc = p;
    p.stdin?.on('error', () => {});
    createInterface({ input: p.stdout! }).on('line', (line) => {
      const w = this.waiting.shift();
      if (!w) return;
      if (line === 'ok') w.resolve();
      else w.reject(new Error(`ramhold: ${line.replace(/^error /, '')}`));
    });
    p.once('exit', (code, signal) => {
      if (this.proc === p) this.proc = undefined;
      const w = this.waiting;
      this.waiting = [];
      for (const x of w) x.reject(new Error(`ramhold: ended (${signal ?? `exit ${code}`})`));
      // What it held went with it: held again by a new one, unless the node is closing.
      if (!this.closed && this.held.size > 0) for (const f of this.held) this.ask(f).catch(() => {});
    });
    return p;
  }

  close(): void {
    this.closed = true;
    this.proc?.stdin?.end();
    this.proc?.kill('SIGKILL');
    this.proc = undefined;
  }
}
