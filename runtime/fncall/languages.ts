/**
 * What each FnCall language runs in and how: its image, where the code goes, how it is compiled
 * and run. Languages of one image share that image's warm pool (python and bash both run in the
 * `python` image; c and cpp in `gcc`).
 */
import { join } from 'node:path';
import type { FnLanguage } from '../../protocol/index.ts';
import { type BuildSpec, buildImage, currentImage, DEFAULT_ENV, ensurePythonImage, PYTHON_SPEC } from '../images/build.ts';
import { withHostLock } from '../images/lock.ts';
import { copyImage, LocalLayerStore } from '../images/remote.ts';
import type { ImageManifest, ImageStore } from '../images/store.ts';

/** Where the submission lives inside a member: read-only to the program. */
export const BOX = '/box';
/** The program's working directory: fresh and writable for every run. */
export const WORK = '/work';

export interface Language {
  image: string;
  /** File name of the code under /box. */
  file: string;
  /** Compiles /box/<file> into ./main (in /work); the node then moves it to /box/main. */
  compile?: string[];
  /** The program's argv (the request's `args` follow). */
  run: string[];
  /** Run once when a member starts, so the first real call finds its files in the page cache. */
  warm: string[];
}

export const LANGUAGES: Record<FnLanguage, Language> = {
  python: { image: 'python', file: 'main.py', run: ['python3', `${BOX}/main.py`], warm: ['python3', '-c', 'import sys, os, re, math, collections'] },
  bash: { image: 'python', file: 'main.sh', run: ['bash', `${BOX}/main.sh`], warm: ['bash', '-c', 'true'] },
  c: {
    image: 'gcc',
    file: 'main.c',
    compile: ['gcc', '-std=gnu17', '-O2', '-pipe', '-o', 'main', `${BOX}/main.c`, '-lm'],
    run: [`${BOX}/main`],
    warm: ['sh', '-c', `printf '#include <stdio.h>\\nint main(void){puts("1");return 0;}\\n' > w.c && gcc -O2 -o w w.c && ./w`],
  },
  cpp: {
    image: 'gcc',
    file: 'main.cpp',
    compile: ['g++', '-std=gnu++17', '-O2', '-pipe', '-o', 'main', `${BOX}/main.cpp`],
    run: [`${BOX}/main`],
    warm: ['sh', '-c', `printf '#include <iostream>\\nint main(){std::cout<<1<<std::endl;}\\n' > w.cpp && g++ -O2 -o w w.cpp && ./w`],
  },
};

/** The C/C++ toolchain image: Debian bookworm minbase with gcc, g++ and the C library headers. */
export const GCC_SPEC: BuildSpec = {
  name: 'gcc',
  base: { suite: 'bookworm', variant: 'minbase' },
  toolkit: { packages: ['gcc', 'g++', 'libc6-dev'] },
  env: DEFAULT_ENV,
  cwd: '/',
  init: ['/bin/sleep', 'infinity'],
  cmd: ['gcc'],
};

/**
 * Images the languages need, each built once per image store (minutes the first time, then
 * cached). An image another local store already has (`copyFrom`, e.g. the host's default store)
 * is copied instead, which takes seconds.
 */
export async function ensureLanguageImages(store: ImageStore, o: { which?: readonly string[]; progress?: NodeJS.WritableStream; copyFrom?: string[] } = {}): Promise<ImageManifest[]> {
  const out: ImageManifest[] = [];
  const progress = o.progress;
  for (const name of o.which ?? ['python', 'gcc']) {
    const spec = name === PYTHON_SPEC.name ? PYTHON_SPEC : name === GCC_SPEC.name ? GCC_SPEC : undefined;
    if (!spec) throw new Error(`no build spec for image ${name}`);
    const have = await currentImage(store, spec);
    if (have) {
      out.push(have);
      continue;
    }
    const from = await firstHaving(spec, (o.copyFrom ?? []).filter((d) => d !== store.root));
    if (from) {
      progress?.write(`[${name}] copying from ${from.location}\n`);
      out.push(await copyImage(name, from, new LocalLayerStore(store.root)));
      continue;
    }
    out.push(spec === PYTHON_SPEC ? await ensurePythonImage(store, { progress }) : await ensureBuilt(store, spec, progress));
  }
  return out;
}

async function firstHaving(spec: BuildSpec, dirs: string[]): Promise<LocalLayerStore | undefined> {
  for (const d of dirs) {
    const s = new LocalLayerStore(d);
    if (await currentImage(s, spec)) return s;
  }
  return undefined;
}

/** Builds `spec` unless the store has it; concurrent builders on one host wait for the first. */
async function ensureBuilt(store: ImageStore, spec: BuildSpec, progress?: NodeJS.WritableStream): Promise<ImageManifest> {
  const have = await currentImage(store, spec);
  if (have) return have;
  await store.init();
  return withHostLock(
    join(store.root, 'tmp', `${spec.name}.lock`),
    () => buildImage(spec, { store, progress }),
    () => currentImage(store, spec),
  );
}
