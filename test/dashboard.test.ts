import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BrowserContext, chromium } from 'playwright-core';
import { clusterTest } from './helpers/cluster.ts';
import { startTestGateway } from './helpers/gateway.ts';

const test = clusterTest();

/** Where the page's screenshot is kept after the run, for a person to look at. */
const ARTIFACTS = join(tmpdir(), 'paddock-test-artifacts');

// Without the background-networking flags Chromium keeps trying hosts this machine cannot reach.
const CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

test('the dashboard loads without console errors, shows a new sandbox, and runs a command typed into its terminal', async (t) => {
  const gw = await startTestGateway(t.context.pdk);
  const profile = await mkdtemp(join(tmpdir(), 'paddock-chromium-'));
  let browser: BrowserContext | undefined;
  t.teardown(async () => {
    await browser?.close();
    await gw.close();
    await rm(profile, { recursive: true, force: true });
  });
  browser = await chromium.launchPersistentContext(profile, { executablePath: '/usr/bin/chromium', headless: true, args: CHROMIUM_FLAGS, viewport: { width: 1400, height: 1000 } });
  const page = browser.pages()[0] ?? (await browser.newPage());
  const errors: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  page.on('pageerror', (e) => errors.push(e.message));

  /** Waits for `selector`; on a miss keeps a screenshot and says what the page reported. */
  const shown = async (selector: string, timeout: number) => {
    try {
      await page.waitForSelector(selector, { timeout });
    } catch (err) {
      await mkdir(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, 'dashboard-failed.png'), fullPage: true }).catch(() => {});
      t.log({ selector, status: await page.textContent('#status').catch(() => null), errors });
      throw err;
    }
  };

  await page.goto(gw.url);
  // Generous bounds: what is checked is that the page gets there, not how fast a loaded machine is.
  await shown('#nodes tbody tr', 60_000);
  t.regex((await page.textContent('#nodes tbody')) ?? '', new RegExp(t.context.cluster.nodes[0]?.id ?? 'no node'));

  // Made through the SDK, not the page: it must show up from the event stream, within two seconds.
  const sb = await t.context.pdk.sandboxes.create({ labels: { job: 'dash' }, group: 'dashgroup', ttlSec: 600 });
  t.teardown(() => sb.kill());
  const made = performance.now();
  await shown(`#sandboxes tr[data-id="${sb.id}"]`, 30_000);
  t.log(`the new sandbox showed after ${Math.round(performance.now() - made)} ms`);
  t.regex((await page.textContent('#bygroup')) ?? '', /dashgroup/);

  await page.click(`#sandboxes tr[data-id="${sb.id}"] a`);
  await shown('#terminal .xterm-rows', 30_000);
  await page.click('#terminal');
  await page.keyboard.type('echo dash-$((6*7)) && hostname');
  await page.keyboard.press('Enter');
  await page.waitForFunction("document.querySelector('#terminal .xterm-rows')?.textContent?.includes('dash-42')", undefined, { timeout: 30_000 });
  await shown('#execs li', 30_000);
  t.regex((await page.textContent('#execs')) ?? '', /echo dash-.*exit 0/);
  t.regex((await page.textContent('#record')) ?? '', new RegExp(sb.id));

  await mkdir(ARTIFACTS, { recursive: true });
  const shot = join(ARTIFACTS, 'dashboard-terminal.png');
  await page.screenshot({ path: shot, fullPage: true });
  t.log(`screenshot: ${shot}`);
  await page.goto(`${gw.url}/#/`);
  await page.waitForSelector('#nodes tbody tr');
  await page.screenshot({ path: join(ARTIFACTS, 'dashboard.png'), fullPage: true });
  t.deepEqual(errors, []);
});
