/** The full VMs' `desktop` image in the tests' shared store (a few minutes the first time on a machine). */
import { existsSync } from 'node:fs';
import { ensureDesktopImage } from '../../runtime/fullvm/image.ts';
import { findGenericKernel } from '../../runtime/microvm/kernel.ts';
import { ImageStore } from '../../runtime/images/store.ts';
import { SHARED_IMAGES } from './paths.ts';

export async function ensureTestDesktop(): Promise<void> {
  // Where the full-VM tests are skipped, nothing needs it.
  if (!existsSync('/usr/bin/qemu-system-x86_64')) return;
  await findGenericKernel();
  await ensureDesktopImage(new ImageStore(SHARED_IMAGES));
}
