// Debian's Chromium (apt-get install chromium) driven by playwright-core for
// the web app's browser tests: headless, no sandbox (containers), nothing
// fetched from the network by the browser itself. Playwright gives every
// launch a fresh user-data-dir of its own.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser } from 'playwright-core';
import { ROOT } from './processes.js';

export const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
/** Where the browser tests leave their screenshots (ignored by git: a test run changes no tracked file). */
export const ARTIFACTS = join(ROOT, 'test', 'artifacts');

export async function launchChromium(): Promise<Browser> {
  if (!existsSync(CHROMIUM)) {
    throw new Error(
      `no Chromium at ${CHROMIUM}: install it (apt-get install chromium) or set CHROMIUM_PATH`,
    );
  }
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
  });
}
