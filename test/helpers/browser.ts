/** Headless Chromium (Debian's) for the tests that look at a page, with its console errors collected. */
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BrowserContext, chromium, type Page } from 'playwright-core';

/** Where screenshots of pages are kept after the run, for a person to look at. */
export const ARTIFACTS = join(tmpdir(), 'paddock-test-artifacts');

// Without the background-networking flags Chromium keeps trying hosts this machine cannot reach.
const CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

export interface TestBrowser {
  browser: BrowserContext;
  page: Page;
  /** Console errors and uncaught exceptions of every page it opened. */
  errors: string[];
  close(): Promise<void>;
}

export async function startBrowser(): Promise<TestBrowser> {
  const profile = await mkdtemp(join(tmpdir(), 'paddock-chromium-'));
  const browser = await chromium.launchPersistentContext(profile, { executablePath: '/usr/bin/chromium', headless: true, args: CHROMIUM_FLAGS, viewport: { width: 1400, height: 1000 } });
  const errors: string[] = [];
  const watched = new WeakSet<Page>();
  const watch = (p: Page) => {
    if (watched.has(p)) return;
    watched.add(p);
    p.on('console', (m) => {
      if (m.type() === 'error') errors.push(m.text());
    });
    p.on('pageerror', (e) => errors.push(e.message));
  };
  browser.on('page', watch);
  const page = browser.pages()[0] ?? (await browser.newPage());
  watch(page);
  return {
    browser,
    page,
    errors,
    close: async () => {
      await browser.close().catch(() => {});
      await rm(profile, { recursive: true, force: true });
    },
  };
}

/** Keeps a screenshot of `page` under ARTIFACTS; its path. */
export async function keepScreenshot(page: Page, name: string): Promise<string> {
  await mkdir(ARTIFACTS, { recursive: true });
  const path = join(ARTIFACTS, name);
  await page.screenshot({ path, fullPage: true });
  return path;
}
