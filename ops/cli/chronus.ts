/** `paddock chronus export`: a rollout's trajectory (its command log) as JSONL. */
import { createWriteStream } from 'node:fs';
import type { Writable } from 'node:stream';
import { type Args, positionals } from './args.ts';
import { note, UsageError, withClient } from './common.ts';

function writeLine(w: Writable, line: string): Promise<void> | undefined {
  if (w.write(`${line}\n`)) return undefined;
  return new Promise((resolve, reject) => {
    w.once('drain', resolve);
    w.once('error', reject);
  });
}

/**
 * `chronus export <rolloutId> [file|-]`: the rollout's trajectory as JSONL (`lines`, from
 * `pdk.rollouts.export`, which is NOT_FOUND for an unknown rollout), to `dest` (default stdout).
 */
export async function exportCommand(lines: AsyncIterable<string>, dest?: string): Promise<number> {
  const toStdout = dest === undefined || dest === '-';
  const w: Writable = toStdout ? process.stdout : createWriteStream(dest, { flags: 'w' });
  const opened = toStdout ? Promise.resolve() : new Promise((resolve, reject) => w.once('open', resolve).once('error', reject));
  await opened;
  let n = 0;
  try {
    for await (const line of lines) {
      await writeLine(w, line);
      n++;
    }
  } finally {
    if (!toStdout) await new Promise<void>((resolve, reject) => w.end((e?: Error | null) => (e ? reject(e) : resolve())));
  }
  return n;
}

/** `chronus export <rolloutId> [file|-]`. */
export async function chronusCli(a: Args): Promise<number> {
  const [verb, id, dest] = a.positionals;
  if (verb !== 'export' || id === undefined) throw new UsageError('usage: paddock chronus export <rolloutId> [file|-]', verb !== 'export');
  positionals(a, 2, 3, 'chronus export <rolloutId> [file|-]');
  return withClient(a.values, async (pdk) => {
    const n = await exportCommand(pdk.rollouts.export(id), dest);
    if (dest !== undefined && dest !== '-') note(`wrote ${n} steps of rollout ${id} to ${dest}`);
    return 0;
  });
}
