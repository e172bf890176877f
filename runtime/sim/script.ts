/**
 * What a simulated exec runs: a small subset of sh, interpreted without a process. `sh -c '<script>'`
 * runs the script; any other argv is one command. Statements are separated by `;`, newlines or
 * `&&`/`||`; words may be quoted; `> file`, `>> file` and `>&2` redirect output.
 *
 *   echo [-n] words…     print                      exit N          end with status N
 *   true | false | :     status 0 / 1               sleep SEC       wait (timeouts and cancel apply)
 *   cat [FILE]           a file (or stdin)          pwd             the working directory
 *   printenv NAME        a variable of the exec     out N / err N   N bytes ('x') to stdout / stderr (N may end in k or m)
 *
 * Anything else prints `sim: <name>: command not found` and has status 127, as sh would.
 */
import type { ExecOptions } from '../backend.ts';
import type { MemoryFiles } from './files.ts';

export interface ScriptEnv {
  files: MemoryFiles;
  env: Record<string, string>;
  cwd: string;
  /** Resolves after `ms`, or rejects when the exec is cancelled or times out. */
  sleep: (ms: number) => Promise<void>;
}

type Sep = ';' | '&&' | '||';
interface Stmt {
  words: string[];
  /** Output redirection: a file (append or not) or stderr. */
  to?: { path: string; append: boolean } | 'err' | 'null';
  sep: Sep;
}

class Stop extends Error {
  constructor(readonly code: number) {
    super(`exit ${code}`);
  }
}

/** Splits a script into statements. Quotes: '…' literal, "…" literal (no expansion in the simulator). */
export function parse(script: string): Stmt[] {
  const out: Stmt[] = [];
  let words: string[] = [];
  let word: string | null = null;
  let redirect: Stmt['to'];
  let pendingRedirect: { append: boolean } | null = null;
  const endWord = () => {
    if (word === null) return;
    if (pendingRedirect) {
      redirect = word === '/dev/null' ? 'null' : { path: word, append: pendingRedirect.append };
      pendingRedirect = null;
    } else words.push(word);
    word = null;
  };
  const endStmt = (sep: Sep) => {
    endWord();
    if (words.length > 0) out.push({ words, ...(redirect ? { to: redirect } : {}), sep });
    else if (out.length > 0) (out[out.length - 1] as Stmt).sep = sep;
    words = [];
    redirect = undefined;
  };
  for (let i = 0; i < script.length; i++) {
    const c = script[i] as string;
    if (c === "'" || c === '"') {
      const end = script.indexOf(c, i + 1);
      if (end < 0) throw new SyntaxError(`unterminated ${c}`);
      word = (word ?? '') + script.slice(i + 1, end);
      i = end;
    } else if (c === ' ' || c === '\t') endWord();
    else if (c === ';' || c === '\n') endStmt(';');
    else if (c === '&' && script[i + 1] === '&') {
      endStmt('&&');
      i++;
    } else if (c === '|' && script[i + 1] === '|') {
      endStmt('||');
      i++;
    } else if (c === '>' && script.slice(i, i + 3) === '>&2') {
      endWord();
      redirect = 'err';
      i += 2;
    } else if (c === '>') {
      endWord();
      const append = script[i + 1] === '>';
      if (append) i++;
      pendingRedirect = { append };
    } else if (c === '2' && script.slice(i, i + 4) === '2>&1' && word === null) {
      i += 3;
    } else word = (word ?? '') + c;
  }
  endStmt(';');
  return out;
}

function size(s: string | undefined): number {
  const m = /^(\d+)([kKmM]?)$/.exec(s ?? '');
  if (!m) return Number.NaN;
  const n = Number(m[1]);
  return m[2] === '' ? n : /k/i.test(m[2] as string) ? n * 1024 : n * 1024 * 1024;
}

/** Runs `opts.cmd`; output goes through `emit`, which returns false once the output cap is hit. */
export async function runScript(opts: ExecOptions, env: ScriptEnv, emit: (stream: 'out' | 'err', data: Buffer) => boolean): Promise<number> {
  const argv = opts.cmd;
  let stmts: Stmt[];
  try {
    stmts = (argv[0] === 'sh' || argv[0] === '/bin/sh' || argv[0] === 'bash') && argv[1] === '-c' ? parse(argv[2] ?? '') : [{ words: argv, sep: ';' }];
  } catch (e) {
    emit('err', Buffer.from(`sim: syntax error: ${(e as Error).message}\n`));
    return 2;
  }
  let status = 0;
  let skip = false;
  try {
    for (const st of stmts) {
      if (!skip) status = await runOne(st, opts, env, emit);
      skip = (st.sep === '&&' && status !== 0) || (st.sep === '||' && status === 0);
    }
  } catch (e) {
    if (e instanceof Stop) return e.code;
    throw e;
  }
  return status;
}

async function runOne(st: Stmt, opts: ExecOptions, env: ScriptEnv, emit: (stream: 'out' | 'err', data: Buffer) => boolean): Promise<number> {
  const [name, ...args] = st.words as [string, ...string[]];
  const chunks: Buffer[] = [];
  const write = (stream: 'out' | 'err', data: Buffer | string) => {
    const b = typeof data === 'string' ? Buffer.from(data) : data;
    if (stream === 'out' && st.to === 'null') return;
    if (stream === 'out' && st.to && st.to !== 'err') return void chunks.push(b);
    if (!emit(stream === 'out' && st.to === 'err' ? 'err' : stream, b)) throw new Stop(137);
  };
  let status = 0;
  switch (name) {
    case 'echo': {
      const n = args[0] === '-n';
      write('out', `${(n ? args.slice(1) : args).join(' ')}${n ? '' : '\n'}`);
      break;
    }
    case 'true':
    case ':':
      break;
    case 'false':
      status = 1;
      break;
    case 'exit': {
      const code = args[0] === undefined ? 0 : Number(args[0]);
      throw new Stop(Number.isInteger(code) ? code & 255 : 2);
    }
    case 'sleep': {
      const sec = Number(args[0]);
      if (!Number.isFinite(sec) || sec < 0) {
        write('err', `sleep: invalid time interval '${args[0] ?? ''}'\n`);
        status = 1;
      } else await env.sleep(sec * 1000);
      break;
    }
    case 'pwd':
      write('out', `${env.cwd}\n`);
      break;
    case 'printenv': {
      const v = args[0] === undefined ? undefined : env.env[args[0]];
      if (v === undefined) status = 1;
      else write('out', `${v}\n`);
      break;
    }
    case 'cat': {
      if (args.length === 0) {
        if (opts.stdin && opts.stdin.length > 0) write('out', Buffer.from(opts.stdin));
        break;
      }
      for (const p of args) {
        const data = env.files.text(p.startsWith('/') ? p : `${env.cwd.replace(/\/$/, '')}/${p}`);
        if (data) write('out', Buffer.from(data));
        else {
          write('err', `cat: ${p}: No such file or directory\n`);
          status = 1;
        }
      }
      break;
    }
    case 'out':
    case 'err': {
      let n = size(args[0]);
      if (!Number.isFinite(n)) {
        write('err', `${name}: expected a byte count, got '${args[0] ?? ''}'\n`);
        status = 2;
        break;
      }
      // Emitted in 64 KiB pieces: a streamed exec sees chunks, and the cap ends it part way.
      const piece = Buffer.alloc(Math.min(n, 64 * 1024), 'x');
      while (n > 0) {
        const k = Math.min(n, piece.length);
        write(name, k === piece.length ? piece : piece.subarray(0, k));
        n -= k;
      }
      break;
    }
    default:
      write('err', `sim: ${name}: command not found\n`);
      status = 127;
  }
  if (st.to && st.to !== 'err' && st.to !== 'null') {
    const path = st.to.path.startsWith('/') ? st.to.path : `${env.cwd.replace(/\/$/, '')}/${st.to.path}`;
    const data = Buffer.concat(chunks);
    const old = st.to.append ? env.files.text(path) : undefined;
    await env.files.write(path, old ? Buffer.concat([old, data]) : data);
  }
  return status;
}

