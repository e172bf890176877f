import { keepScreenshot, startBrowser } from './helpers/browser.ts';
import { clusterTest } from './helpers/cluster.ts';
import { startTestGateway } from './helpers/gateway.ts';
import { eventually } from './helpers/wait.ts';

const test = clusterTest();

test('the dashboard loads without console errors, shows a new sandbox, and runs a command typed into the shell of its terminal', async (t) => {
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
  // A shell on a pseudo-terminal: the keys go as typed, and `tty` names the terminal.
  await page.keyboard.type('echo dash-$((6*7)) && tty');
  await page.keyboard.press('Enter');
  await page.waitForFunction("(t => t.includes('dash-42') && t.includes('/dev/pts/'))(document.querySelector('#terminal .xterm-rows')?.textContent ?? '')", undefined, { timeout: 30_000 });
  t.is((await sb.processes.list()).filter((p) => p.tag === 'dashboard' && p.state === 'running').length, 1, 'the page holds one shell');
  t.regex((await page.textContent('#record')) ?? '', new RegExp(sb.id));

  t.log(`screenshot: ${await keepScreenshot(page, 'dashboard-terminal.png')}`);
  await page.goto(`${gw.url}/#/`);
  await page.waitForSelector('#nodes tbody tr');
  // Leaving the sandbox's page ends its shell.
  await eventually(async () => (await sb.processes.list()).every((p) => p.tag !== 'dashboard' || p.state !== 'running'));
  await keepScreenshot(page, 'dashboard.png');
  t.deepEqual(errors, []);
});
