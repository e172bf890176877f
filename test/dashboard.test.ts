import { keepScreenshot, startBrowser } from './helpers/browser.ts';
import { clusterTest } from './helpers/cluster.ts';
import { startTestGateway } from './helpers/gateway.ts';

const test = clusterTest();

test('the dashboard loads without console errors, shows a new sandbox, and runs a command typed into its terminal', async (t) => {
  const gw = await startTestGateway(t.context.pdk);
  const b = await startBrowser();
  t.teardown(async () => {
    await b.close();
    await gw.close();
  });
  const { page, errors } = b;

  /** Waits for `selector`; on a miss keeps a screenshot and says what the page reported. */
  const shown = async (selector: string, timeout: number) => {
    try {
      await page.waitForSelector(selector, { timeout });
    } catch (err) {
      await keepScreenshot(page, 'dashboard-failed.png').catch(() => {});
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

  t.log(`screenshot: ${await keepScreenshot(page, 'dashboard-terminal.png')}`);
  await page.goto(`${gw.url}/#/`);
  await page.waitForSelector('#nodes tbody tr');
  await keepScreenshot(page, 'dashboard.png');
  t.deepEqual(errors, []);
});
