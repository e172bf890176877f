/** Where the test files share their images (no ava here: `npm test` imports it before ava runs). */
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const SHARED_IMAGES = join(tmpdir(), 'paddock-test-images');
