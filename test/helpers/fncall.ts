/**
 * The images FnCall's languages run in (python, gcc), in the tests' shared store: built once per
 * machine (about a minute each the first time; copied in seconds when the host's default store
 * already has them), found there ever after.
 */
import { ensureLanguageImages } from '../../runtime/fncall/languages.ts';
import { loadConfig } from '../../runtime/config.ts';
import { ImageStore } from '../../runtime/images/store.ts';
import { SHARED_IMAGES } from './paths.ts';

export async function ensureFnImages(): Promise<void> {
  await ensureLanguageImages(new ImageStore(SHARED_IMAGES), { copyFrom: [loadConfig({}).imagesDir] });
}
