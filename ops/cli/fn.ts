/**
 * `paddock fn …`: run a file as one FnCall invocation (`fn run file.py < input`), and build the
 * images the languages run in (`fn build`; nodes also build them in the background at their
 * first start).
 */

import { readFile } from 'node:fs/promises';
import { extname } from 'node:path';
import { type FnLanguage, FnLanguages, type FnLimits, Limits } from '../../protocol/index.ts';
import { loadConfig } from '../../runtime/config.ts';
import { ensureLanguageImages } from '../../runtime/fncall/languages.ts';
import { type ImageManifest, ImageStore } from '../../runtime/images/store.ts';
import type { FnRequest, FnResult } from '../../sdk/index.ts';
import { parseFlags } from './args.ts';
import { connect, type GlobalFlags, out, positiveNumber, UsageError } from './common.ts';

export const FN_USAGE = `Usage: paddock fn <command>

  run <file> [--language L] [--time-limit MS] [--wall-limit MS] [--memory MiB]
      [--output-limit BYTES] [--env K=V]... [--json] [-- args...]  < input
                           run the file once on any node (FnCall), its stdin from this
                           command's piped stdin; prints its stdout and stderr, and the verdict
                           on stderr unless OK. The language comes from the extension (.py .c
                           .cpp .cc .sh) unless given. Exit status: the program's, 124 on
                           TIME_LIMIT, 1 on the other limits and on COMPILE_ERROR.
  build                    build the images the languages run in (python, gcc) into the local
                           store, $PADDOCK_IMAGES_DIR (minutes the first time, then cached), and
                           put them in the running Paddock's store (nodes with a store of their
                           own also make them in the background at their first start)
`;

export class FnUsageError extends Error {}

export interface FnCliIo {
  out: (s: string) => void;
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream & { isTTY?: boolean };
  stdin: NodeJS.ReadableStream & { isTTY?: boolean };
  connect: () => Promise<{ fn: { invoke(req: FnRequest): Promise<FnResult> }; close(): Promise<void> }>;
  /** Puts a built image where the running Paddock's nodes read (when that is not the local store). */
  publish?: (m: ImageManifest) => Promise<void>;
}

const BY_EXTENSION: Record<string, FnLanguage> = { '.py': 'python', '.c': 'c', '.cpp': 'cpp', '.cc': 'cpp', '.cxx': 'cpp', '.sh': 'bash', '.bash': 'bash' };

async function readAll(s: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of s) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** What the exit status says about a verdict. */
export function exitStatusOf(r: Pick<FnResult, 'verdict' | 'exitCode'>): number {
  switch (r.verdict) {
    case 'OK':
    case 'WRONG_ANSWER':
      return r.exitCode;
    case 'RUNTIME_ERROR':
      return r.exitCode === 0 ? 1 : r.exitCode;
    case 'TIME_LIMIT':
      return 124;
    default:
      return 1;
  }
}

export async function fnCommand(argv: string[], io: FnCliIo): Promise<number> {
  const [cmd, ...rest] = argv;
  const { values, positionals } = parseFlags(
    rest,
    {
      language: { type: 'string' },
      'time-limit': { type: 'string' },
      'wall-limit': { type: 'string' },
      memory: { type: 'string' },
      'output-limit': { type: 'string' },
      env: { type: 'string', multiple: true },
      json: { type: 'boolean' },
    },
    (m) => new FnUsageError(m),
  );
  switch (cmd) {
    case 'build': {
      const cfg = loadConfig();
      const ms = await ensureLanguageImages(new ImageStore(cfg.imagesDir), { progress: io.stderr });
      if (io.publish) for (const m of ms) await io.publish(m);
      for (const m of ms) io.out(`${m.name} ${m.layers.map((l) => l.digest.slice(7, 19)).join(' ')}`);
      return 0;
    }
    case 'run': {
      const [file, ...args] = positionals;
      if (!file) throw new FnUsageError('run: which file?');
      const language = (values.language ?? BY_EXTENSION[extname(file).toLowerCase()]) as FnLanguage | undefined;
      if (!language) throw new FnUsageError(`run: cannot tell the language of ${file}; give --language (${FnLanguages.join(', ')})`);
      if (!(FnLanguages as readonly string[]).includes(language)) throw new FnUsageError(`--language ${language}: one of ${FnLanguages.join(', ')}`);
      const code = await readFile(file).catch((e: NodeJS.ErrnoException) => {
        throw new FnUsageError(`run: cannot read ${file}: ${e.code ?? e.message}`);
      });
      const limits: Partial<FnLimits> = {};
      const set = (k: keyof FnLimits, flag: string, v: string | undefined) => {
        const n = positiveNumber(flag, v, true);
        if (n !== undefined) limits[k] = n;
      };
      set('timeMs', 'time-limit', values['time-limit']);
      set('wallMs', 'wall-limit', values['wall-limit']);
      set('memoryMiB', 'memory', values.memory);
      set('outputBytes', 'output-limit', values['output-limit']);
      const env: Record<string, string> = {};
      for (const kv of values.env ?? []) {
        const i = kv.indexOf('=');
        if (i <= 0) throw new FnUsageError(`--env ${kv}: expected K=V`);
        env[kv.slice(0, i)] = kv.slice(i + 1);
      }
      const stdin = io.stdin.isTTY ? undefined : await readAll(io.stdin);
      if (stdin && stdin.length > Limits.exec.stdinMax) throw new FnUsageError(`stdin is ${stdin.length} bytes, more than ${Limits.exec.stdinMax}`);
      const pdk = await io.connect();
      let r: FnResult;
      try {
        r = await pdk.fn.invoke({ language, code, args, limits, ...(stdin ? { stdin } : {}), ...(Object.keys(env).length ? { env } : {}) });
      } finally {
        await pdk.close().catch(() => {});
      }
      if (values.json) {
        io.out(JSON.stringify(r, null, 2));
        return exitStatusOf(r);
      }
      if (r.compileOutput && r.verdict === 'COMPILE_ERROR') io.stderr.write(r.compileOutput);
      io.stdout.write(r.stdout);
      io.stderr.write(r.stderr);
      if (r.verdict !== 'OK') io.stderr.write(`paddock: ${r.verdict}${r.reason ? `: ${r.reason}` : ''} (${r.timeMs} ms CPU, ${r.wallMs} ms wall, ${Math.round(r.memoryBytes / 1024)} KiB)\n`);
      return exitStatusOf(r);
    }
    case undefined:
    case 'help':
      io.out(FN_USAGE);
      return 0;
    default:
      throw new FnUsageError(`unknown command '${cmd}'`);
  }
}

/** `fn …` from the command line: its flags are its own; a usage error exits 2. */
export async function fnCli(g: GlobalFlags, rest: string[]): Promise<number> {
  try {
    const publish = async (m: ImageManifest) => (await import('./images.ts')).publish(m, { connect: () => connect(g), err: process.stderr });
    return await fnCommand(rest, { out, stdout: process.stdout, stderr: process.stderr, stdin: process.stdin, connect: () => connect(g), publish });
  } catch (err) {
    if (err instanceof FnUsageError) throw new UsageError(`fn: ${err.message}`);
    throw err;
  }
}
