// The web app's branching controls in a real browser (Debian's Chromium
// through playwright-core) against the built standalone app (docs/protocol.md
// "Branching", issue 27): "Edit" with its "Edit message" box and "Save and
// send", "Regenerate" on the last answer, "Fork from here" opening the fork,
// undone messages folded under "Show earlier version"; reached by keyboard.
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Browser, BrowserContext, Locator, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ARTIFACTS, launchChromium } from '../support/browser.js';
import { freePort, startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { standaloneDataDir } from '../support/migrated-template.js';

/** Whether `target` has the keyboard focus (run in the page; this file has no DOM lib). */
const isFocused = (target: Locator) =>
  target.evaluate(
    (element) =>
      element === (element.ownerDocument as unknown as { activeElement: unknown }).activeElement,
  );

const TIMEOUT = 15_000;

describe('web app: branching', () => {
  let app: AppProcess;
  let dataDir: string;
  let browser: Browser;
  const contexts: BrowserContext[] = [];

  beforeAll(async () => {
    dataDir = standaloneDataDir('cs-web-branching-');
    const env = { DATA_DIR: dataDir, PORT: String(await freePort()), RATE_LIMIT_PER_MINUTE: '0' };
    [browser, app] = await Promise.all([launchChromium(), startApp('standalone', env)]);
    mkdirSync(ARTIFACTS, { recursive: true });
  });

  afterEach(async () => {
    for (const context of contexts.splice(0)) await context.close();
  });

  afterAll(async () => {
    await browser?.close();
    await app?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  async function signedInPage() {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    contexts.push(context);
    const page = await context.newPage();
    const errors: string[] = [];
    page.on('pageerror', (error) => errors.push(error.message));
    await page.goto(app.url);
    await page.getByLabel('User id (optional)').fill(uniqueName('user'));
    await page.getByRole('button', { name: 'Sign in with a development token' }).click();
    await page.getByRole('button', { name: 'New conversation' }).click();
    await page.waitForURL(/#\/c\/[0-9a-f-]{36}$/, { timeout: TIMEOUT });
    return { page, errors };
  }

  const article = (page: Page, text: string) =>
    page
      .getByRole('article')
      .filter({ has: page.locator('.message-body', { hasText: new RegExp(`^\\s*${text}\\s*$`) }) });

  async function send(page: Page, text: string) {
    await page.getByRole('textbox', { name: 'Message' }).fill(text);
    await page.getByRole('button', { name: 'Send' }).click();
    await article(page, `echo: ${text}`).waitFor({ timeout: TIMEOUT });
  }

  /** The texts of the messages shown (folded ones are not), in order. */
  async function shownTexts(page: Page): Promise<string[]> {
    const texts = await page.getByRole('article').locator('.message-body').allTextContents();
    return texts.map((text) => text.trim());
  }

  /** Presses Tab until the focused element is `target` (at most `limit` times). */
  async function tabTo(page: Page, target: Locator, limit = 60) {
    for (let n = 0; n < limit; n += 1) {
      await page.keyboard.press('Tab');
      if (await isFocused(target)) return;
    }
    throw new Error(`${String(target)} was not reached with Tab`);
  }

  it('regenerates the last answer, edits a message and folds what they undid under "Show earlier version"', async () => {
    const { page, errors } = await signedInPage();
    await send(page, 'first');
    await send(page, 'second');
    // Only the last answer offers "Regenerate".
    await expect(page.getByRole('button', { name: 'Regenerate' }).count()).resolves.toBe(1);
    await expect(
      article(page, 'echo: first').getByRole('button', { name: 'Regenerate' }).count(),
    ).resolves.toBe(0);

    await article(page, 'echo: second').getByRole('button', { name: 'Regenerate' }).click();
    const earlier = page.getByRole('button', { name: 'Show earlier version' });
    await earlier.first().waitFor({ timeout: TIMEOUT });
    await article(page, 'echo: second').waitFor({ timeout: TIMEOUT });
    await expect(shownTexts(page)).resolves.toEqual([
      'first',
      'echo: first',
      'second',
      'echo: second',
    ]);
    // Unfolded, the earlier answer shows, without controls.
    await earlier.first().click();
    await expect(earlier.first().getAttribute('aria-expanded')).resolves.toBe('true');
    await expect(article(page, 'echo: second').count()).resolves.toBe(2);
    await earlier.first().click();
    await expect(article(page, 'echo: second').count()).resolves.toBe(1);

    // Edit the first message by keyboard: Tab to its "Edit", Enter, type, Save and send.
    const edit = article(page, 'first').getByRole('button', { name: 'Edit' });
    await tabTo(page, edit);
    await page.keyboard.press('Enter');
    const box = page.getByRole('textbox', { name: 'Edit message' });
    await box.waitFor({ timeout: TIMEOUT });
    await expect(box.inputValue()).resolves.toBe('first');
    // Focused once the box is drawn (an effect after its render).
    await expect.poll(() => isFocused(box), { timeout: TIMEOUT }).toBe(true);
    await page.keyboard.press('Control+A');
    await page.keyboard.type('changed');
    await page.keyboard.press('Tab');
    await expect(isFocused(page.getByRole('button', { name: 'Save and send' }))).resolves.toBe(
      true,
    );
    await page.keyboard.press('Enter');
    await article(page, 'echo: changed').waitFor({ timeout: TIMEOUT });
    await expect(shownTexts(page)).resolves.toEqual(['changed', 'echo: changed']);
    await expect(earlier.count()).resolves.toBeGreaterThanOrEqual(1);
    await page.screenshot({ path: join(ARTIFACTS, 'branching-web-app.png') });
    expect(errors).toEqual([]);
  });

  it('forks from a message and opens the fork, holding the messages up to it', async () => {
    const { page, errors } = await signedInPage();
    await send(page, 'keep me');
    await send(page, 'not in the fork');
    const source = page.url();
    await article(page, 'echo: keep me').getByRole('button', { name: 'Fork from here' }).click();
    await page.waitForURL(
      (url) => url.toString() !== source && /#\/c\/[0-9a-f-]{36}$/.test(url.toString()),
      {
        timeout: TIMEOUT,
      },
    );
    await article(page, 'echo: keep me').waitFor({ timeout: TIMEOUT });
    await expect(shownTexts(page)).resolves.toEqual(['keep me', 'echo: keep me']);
    // The fork goes on on its own.
    await send(page, 'after the fork');
    await expect(shownTexts(page)).resolves.toEqual([
      'keep me',
      'echo: keep me',
      'after the fork',
      'echo: after the fork',
    ]);
    expect(errors).toEqual([]);
  });
});
