/**
 * Loaded by ava into every worker (ava.config.mjs `require`): the worker writes which test file it
 * runs where `npm test`'s watchdog looks (PADDOCK_TEST_MARKS), so a hung run can say what hangs.
 */
import { unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';

const dir = process.env.PADDOCK_TEST_MARKS;
if (dir) {
  const mark = join(dir, String(process.pid));
  try {
    writeFileSync(mark, fileURLToPath(test.meta.file));
    process.once('exit', () => {
      try {
        unlinkSync(mark);
      } catch {}
    });
  } catch {
    // the watchdog is gone: nothing to tell
  }
}
