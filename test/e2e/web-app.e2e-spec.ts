// The web app in a real browser (Debian's Chromium through playwright-core)
// against the built standalone app started by the test: what a person does,
// found by the accessible names of docs/protocol.md "Web app".
//
// Streaming and approval use the agents of the test agent module, which the
// app loads beside its own (AGENT_MODULES, test/fixtures/agents/scripted-agents.mjs);
// the other tests talk to the default echo agent.
import { mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { SignJWT } from 'jose';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AGENT_MODULE } from '../support/agent-runtime.js';
import { api, devToken } from '../support/clients.js';
import { ARTIFACTS, launchChromium } from '../support/browser.js';
import { freePort, startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { standaloneDataDir } from '../support/migrated-template.js';

// What the functions run in the page (page.evaluate) see; this file is compiled without the DOM lib.
declare const window: { __pwned?: unknown };
declare const document: {
  documentElement: { scrollWidth: number };
  activeElement: { id: string; textContent: string | null } | null;
  body: { append(element: unknown): void };
  createElement(tag: string): { src: string; onload: unknown; onerror: unknown };
};

const TIMEOUT = 15_000;

describe('web app', () => {
  let app: AppProcess;
  let env: Record<string, string>;
  let dataDir: string;
  let browser: Browser;
  const contexts: BrowserContext[] = [];

  const startService = async () => {
    app = await startApp('standalone', env);
  };

  beforeAll(async () => {
    dataDir = standaloneDataDir('cs-web-');
    env = {
      DATA_DIR: dataDir,
      PORT: String(await freePort()),
      RATE_LIMIT_PER_MINUTE: '0',
      AGENT_MODULES: AGENT_MODULE,
    };
    [browser] = await Promise.all([launchChromium(), startService()]);
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

  /**
   * A fresh browser profile's page, with errors of the page collected: what
   * the page's Content-Security-Policy refused counts as one.
   */
  async function newPage(viewport = { width: 1280, height: 800 }) {
    const context = await browser.newContext({ viewport });
    contexts.push(context);
    const page = await context.newPage();
    const errors: string[] = [];
    page.on('pageerror', (error) => errors.push(error.message));
    page.on('console', (message) => {
      if (/Content Security Policy/i.test(message.text())) errors.push(message.text());
    });
    return { context, page, errors };
  }

  /** Signs in as a user of the test's own, through the development token button. */
  async function signIn(page: Page, user = uniqueName('user'), url = app.url) {
    await page.goto(url);
    await page.getByLabel('User id (optional)').fill(user);
    await page.getByRole('button', { name: 'Sign in with a development token' }).click();
    await page.getByRole('button', { name: 'New conversation' }).waitFor({ timeout: TIMEOUT });
    return user;
  }

  async function newConversation(page: Page): Promise<string> {
    await page.getByRole('button', { name: 'New conversation' }).click();
    await page.waitForURL(/#\/c\/[0-9a-f-]{36}$/, { timeout: TIMEOUT });
    return new URL(page.url()).hash.slice('#/c/'.length);
  }

  async function send(page: Page, text: string) {
    await page.getByRole('textbox', { name: 'Message' }).fill(text);
    await page.getByRole('button', { name: 'Send' }).click();
  }

  /** The messages whose text (under the line naming who wrote it and when) has `text`. */
  const article = (page: Page, text: string | RegExp) =>
    page.getByRole('article').filter({ has: page.locator('.message-body', { hasText: text }) });

  async function seeReply(page: Page, text: string) {
    await article(page, `echo: ${text}`).waitFor({ timeout: TIMEOUT });
  }

  /** The text of every message shown, in order. */
  async function articleTexts(page: Page): Promise<string[]> {
    const texts = await page.getByRole('article').locator('.message-body').allTextContents();
    return texts.map((text) => text.trim());
  }

  describe('with agent modules', () => {
    /** A page signed in, opened on a conversation of a test agent created through the API. */
    async function openAgentConversation(body: Record<string, unknown>) {
      const opened = await newPage();
      const user = await signIn(opened.page);
      const token = await devToken(app.url, { user_id: user });
      const created = await api<{ conversation_id: string }>(
        app.url,
        'POST',
        '/api/conversations',
        {
          token,
          body,
        },
      );
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      await opened.page.goto(`${app.url}/#/c/${created.body.conversation_id}`);
      await opened.page
        .getByRole('status')
        .filter({ hasText: 'Live' })
        .waitFor({ timeout: TIMEOUT });
      return opened;
    }

    it('shows the streamed text before the stored answer, then the answer', async () => {
      const text = [
        'Streaming in the browser means the reader sees the answer grow word by word',
        'long before the agent has finished thinking it through, which makes a slow',
        'answer feel quick and lets a person stop an agent that has gone astray early.',
      ].join(' ');
      const chunks = 20;
      const { page, errors } = await openAgentConversation({
        agent: 'streamer',
        agent_config: { text, chunks, delay_ms: 150 },
      });
      await send(page, 'tell me something long');
      const firstChunk = text.slice(0, Math.ceil(text.length / chunks));
      const streamed = page.getByRole('log', { name: 'Messages' }).getByText(firstChunk);
      await streamed.waitFor({ timeout: TIMEOUT });
      // Read the streamed text, then check that no article had the answer: articles only come.
      const partial = (await streamed.textContent()) ?? '';
      await expect(article(page, text).count()).resolves.toBe(0);
      expect(text.startsWith(partial)).toBe(true);
      expect(partial.length).toBeGreaterThanOrEqual(firstChunk.length);
      expect(partial.length).toBeLessThan(text.length);

      await article(page, text).waitFor({ timeout: TIMEOUT });
      await expect(articleTexts(page)).resolves.toEqual(['tell me something long', text]);
      expect(errors).toEqual([]);
    });

    it('collapses a streamed text once it is long, without drawing it again on every delta, and keeps it shown whole once stored', async () => {
      // 24,000 characters in 40 deltas: longer than plain-text.ts COLLAPSE_CHARS (16,384) after 28.
      const line = 'a streamed line\n';
      const text = line.repeat(1_500);
      const { page, errors } = await openAgentConversation({
        agent: 'streamer',
        agent_config: { text: line, repeat: 1_500, chunks: 40, delay_ms: 200 },
      });
      await send(page, 'tell me something longer');
      const streaming = page.locator('[data-streaming="true"]');
      await streaming
        .getByRole('button', { name: /^Show the whole message \(/ })
        .waitFor({ timeout: TIMEOUT });
      const toggle = streaming.locator('button[aria-expanded]');
      const head = streaming.locator('.message-text > p');
      await expect(head.textContent()).resolves.toBe(line.repeat(40));
      await expect(toggle.getAttribute('aria-expanded')).resolves.toBe('false');

      // The next deltas change the count on the button, not the text shown: its paragraph stays.
      const paragraph = await head.elementHandle();
      const label = await toggle.textContent();
      await page.waitForFunction(
        ([button, before]) => button?.textContent !== before,
        [await toggle.elementHandle(), label] as const,
        { timeout: TIMEOUT },
      );
      await expect(paragraph?.evaluate((element) => element.isConnected)).resolves.toBe(true);
      await expect(head.textContent()).resolves.toBe(line.repeat(40));

      // Shown whole while it streams, it goes on growing, and stays whole once stored.
      await toggle.click();
      await expect(toggle.getAttribute('aria-expanded')).resolves.toBe('true');
      const answer = page.getByRole('article', { name: /^Agent / });
      await answer.waitFor({ timeout: TIMEOUT });
      await expect(streaming.count()).resolves.toBe(0);
      await expect(
        answer.getByRole('button', { name: 'Show less' }).getAttribute('aria-expanded'),
      ).resolves.toBe('true');
      await expect(answer.locator('.message-body').textContent()).resolves.toBe(text);
      expect(errors).toEqual([]);
    });

    it('approves and rejects a tool call from its buttons', async () => {
      const { page, errors } = await openAgentConversation({
        agent: 'tool_user',
        agent_config: { tool: 'current_time', arguments: {} },
        confirmation_mode: true,
      });
      const approve = page.getByRole('button', { name: 'Approve' });
      const reject = page.getByRole('button', { name: 'Reject' });

      await send(page, 'what time is it?');
      await approve.waitFor({ timeout: TIMEOUT });
      await expect(reject.count()).resolves.toBe(1);
      await approve.click();
      const approved = article(page, 'tool said:');
      await approved.waitFor({ timeout: TIMEOUT });
      await expect(approved.textContent()).resolves.toMatch(/tool said: \d{4}-/);
      await approve.waitFor({ state: 'detached', timeout: TIMEOUT });

      await send(page, 'and again?');
      await reject.waitFor({ timeout: TIMEOUT });
      await reject.click();
      await article(page, '[is_error,rejected]').waitFor({ timeout: TIMEOUT });
      await reject.waitFor({ state: 'detached', timeout: TIMEOUT });
      await expect(article(page, 'tool said:').count()).resolves.toBe(2);
      expect(errors).toEqual([]);
    });
  });

  it('signs in with a development token, creates a conversation, sends a message and shows the reply', async () => {
    const { page, errors } = await newPage();
    await signIn(page);
    const id = await newConversation(page);
    const listed = page.getByRole('link', { name: /Untitled conversation/ });
    await listed.waitFor({ timeout: TIMEOUT });
    await expect(listed.count()).resolves.toBe(1);
    await send(page, 'hello from the browser');
    await seeReply(page, 'hello from the browser');
    await expect(article(page, 'hello from the browser').count()).resolves.toBe(2); // the message and its echo
    // Each message is named by who wrote it and when, as a person reads a time;
    // the exact time is its <time>'s datetime.
    const mine = page.getByRole('article', { name: /^You \d{1,2}:\d{2}(\s[AP]M)?$/ });
    const reply = page.getByRole('article', { name: /^Agent \d{1,2}:\d{2}(\s[AP]M)?$/ });
    for (const message of [mine, reply]) {
      await expect(message.count()).resolves.toBe(1);
      const datetime = await message.locator('time').getAttribute('datetime');
      expect(new Date(datetime ?? '').toISOString()).toBe(datetime);
    }
    await expect(page.getByRole('textbox', { name: 'Message' }).inputValue()).resolves.toBe('');
    expect(id).toMatch(/^[0-9a-f-]{36}$/);

    // The history is there after a reload, each message once.
    await page.reload();
    await seeReply(page, 'hello from the browser');
    await expect(article(page, 'echo: hello from the browser').count()).resolves.toBe(1);
    // The history may show before the socket is live again: wait for it, then there is one.
    const live = page.getByRole('status').filter({ hasText: 'Live' });
    await live.waitFor({ timeout: TIMEOUT });
    await expect(live.count()).resolves.toBe(1);
    expect(errors).toEqual([]);
  });

  it('asks for a development token only to sign in with one; where they are off, offers the token sign-in alone, without an error', async () => {
    const asked = (page: Page) => {
      const requests: string[] = [];
      page.on('request', (request) => {
        if (new URL(request.url()).pathname === '/api/dev/token') requests.push(request.url());
      });
      return requests;
    };
    const consoleErrors = (page: Page) => {
      const errors: string[] = [];
      page.on('console', (message) => {
        if (message.type() === 'error') errors.push(message.text());
      });
      return errors;
    };

    // The service with an operator's key for the second half, started meanwhile
    // on a copy of the migrated PGlite folder (a new one costs seconds of initdb).
    const secret = 'web-e2e-secret-0123456789abcdef-0123';
    const offDir = standaloneDataDir('cs-web-off-');
    const offStarting = freePort().then((port) =>
      startApp('standalone', { DATA_DIR: offDir, PORT: String(port), AUTH_JWT_SECRET: secret }),
    );
    void offStarting.catch(() => undefined); // a failed start fails the test where it is awaited
    try {
      // On: the button is there from the start, and only its click asks the service.
      const on = await newPage();
      const onRequests = asked(on.page);
      const onErrors = consoleErrors(on.page);
      await on.page.goto(app.url);
      const devSignIn = on.page.getByRole('button', { name: 'Sign in with a development token' });
      await devSignIn.waitFor({ timeout: TIMEOUT });
      await on.page.waitForTimeout(300);
      expect(onRequests).toEqual([]);
      await devSignIn.click();
      await on.page.getByRole('button', { name: 'New conversation' }).waitFor({ timeout: TIMEOUT });
      expect(onRequests).toHaveLength(1);
      expect(onErrors).toEqual([]);

      // Off (a service with an operator's key): no button, no request, no error; a token signs in.
      const offApp = await offStarting;
      const off = await newPage();
      const offRequests = asked(off.page);
      const offErrors = consoleErrors(off.page);
      await off.page.goto(offApp.url);
      const pasteSignIn = off.page.getByRole('button', { name: 'Sign in with this token' });
      await pasteSignIn.waitFor({ timeout: TIMEOUT });
      await off.page.waitForTimeout(300);
      await expect(
        off.page.getByRole('button', { name: 'Sign in with a development token' }).count(),
      ).resolves.toBe(0);
      const token = await new SignJWT({ sub: uniqueName('user'), tid: uniqueName('tenant') })
        .setProtectedHeader({ alg: 'HS256' })
        .setExpirationTime('1h')
        .sign(new TextEncoder().encode(secret));
      await off.page.getByLabel('Bearer token').fill(token);
      await pasteSignIn.click();
      await off.page
        .getByRole('button', { name: 'New conversation' })
        .waitFor({ timeout: TIMEOUT });
      expect(offRequests).toEqual([]);
      expect(offErrors).toEqual([]);
    } finally {
      await offStarting.then(
        (offApp) => offApp.stop(),
        () => undefined,
      );
      rmSync(offDir, { recursive: true, force: true });
    }
  });

  it('updates two tabs on one conversation, whichever sends', async () => {
    const { context, page } = await newPage();
    await signIn(page);
    await newConversation(page);
    const other = await context.newPage();
    await other.goto(page.url());
    await other.getByRole('status').filter({ hasText: 'Live' }).waitFor({ timeout: TIMEOUT });
    await page.getByRole('status').filter({ hasText: 'Live' }).waitFor({ timeout: TIMEOUT });
    await send(page, 'from the first tab');
    await seeReply(page, 'from the first tab');
    await seeReply(other, 'from the first tab');
    await send(other, 'from the second tab');
    await seeReply(other, 'from the second tab');
    await seeReply(page, 'from the second tab');
    for (const tab of [page, other]) {
      await expect(articleTexts(tab)).resolves.toEqual([
        'from the first tab',
        'echo: from the first tab',
        'from the second tab',
        'echo: from the second tab',
      ]);
    }
  });

  it('shows the connection lost while the server restarts, reconnects and goes on', async () => {
    const { page, errors } = await newPage();
    await signIn(page);
    await newConversation(page);
    await send(page, 'before the restart');
    await seeReply(page, 'before the restart');
    await app.stop();
    await page
      .getByRole('status')
      .filter({ hasText: 'Reconnecting' })
      .waitFor({ timeout: TIMEOUT });
    await expect(page.getByText('Connection lost').count()).resolves.toBe(1);
    await startService();
    await page.getByRole('status').filter({ hasText: 'Live' }).waitFor({ timeout: 30_000 });
    await send(page, 'after the restart');
    await seeReply(page, 'after the restart');
    await expect(articleTexts(page)).resolves.toEqual([
      'before the restart',
      'echo: before the restart',
      'after the restart',
      'echo: after the restart',
    ]);
    expect(errors).toEqual([]);
  }, 90_000);

  it('renders agent output inert: no handler runs, no javascript: link', async () => {
    const { page } = await newPage();
    const user = await signIn(page);
    const token = await devToken(app.url, { user_id: user });
    const hostile = [
      '<img src=x onerror="window.__pwned = 1">',
      '[a markdown link](javascript:window.__pwned=2)',
      '<a href="javascript:window.__pwned=3">an html link</a>',
      '<script>window.__pwned = 4</script>',
      '<svg><script>window.__pwned = 5</script></svg>',
      '<iframe src="javascript:parent.__pwned=6"></iframe>',
      '**bold** stays',
    ].join('\n\n');
    const created = await api<{ conversation_id: string }>(app.url, 'POST', '/api/conversations', {
      token,
      body: {
        title: 'hostile',
        replay_json: JSON.stringify([
          { source: 'user', action: 'message', args: { content: 'show me' }, message: '' },
          { source: 'agent', action: 'message', args: { content: hostile }, message: '' },
        ]),
      },
    });
    expect(created.status).toBe(201);
    await page.goto(`${app.url}/#/c/${created.body.conversation_id}`);
    const message = article(page, 'bold stays');
    await message.waitFor({ timeout: TIMEOUT });
    // The echo agent repeats a user's HTML verbatim: that reply is inert too.
    await send(page, '<img src=y onerror="window.__pwned = 7">');
    await page.getByRole('article').nth(3).waitFor({ timeout: TIMEOUT }); // its echo
    await expect(message.locator('strong').textContent()).resolves.toBe('bold');
    const log = page.getByRole('log', { name: 'Messages' });
    await expect(log.locator('[onerror], img, script, svg, iframe').count()).resolves.toBe(0);
    const hrefs = await log
      .locator('a')
      .evaluateAll((links) => links.map((link) => link.getAttribute('href')));
    expect(hrefs.some((href) => href?.trim().toLowerCase().startsWith('javascript'))).toBe(false);
    await message.getByText('a markdown link').click();
    await page.waitForTimeout(500);
    await expect(page.evaluate(() => window.__pwned)).resolves.toBe(undefined);
    // HTML in a message is part of its text, shown as written: the agent's, and the user's.
    const texts = await articleTexts(page);
    for (const line of hostile.split('\n\n').filter((line) => line.startsWith('<'))) {
      expect(texts[1]).toContain(line);
    }
    expect(texts.slice(2)).toEqual([
      '<img src=y onerror="window.__pwned = 7">',
      'echo: <img src=y onerror="window.__pwned = 7">',
    ]);
  });

  it("loads nothing from another origin: an agent's image is a link, and the page's policy refuses the rest", async () => {
    // Another origin on this machine that records what reaches it.
    const reached: string[] = [];
    const elsewhere = createServer((request, response) => {
      reached.push(request.url ?? '');
      response.writeHead(200, { 'content-type': 'image/gif' }).end();
    });
    await new Promise<void>((resolve) => elsewhere.listen(0, '127.0.0.1', resolve));
    const origin = `http://localhost:${(elsewhere.address() as AddressInfo).port}`;
    try {
      const { page } = await newPage();
      const refused: string[] = [];
      page.on('console', (message) => {
        if (/Content Security Policy/i.test(message.text())) refused.push(message.text());
      });
      const user = await signIn(page);
      const token = await devToken(app.url, { user_id: user });
      const exfiltrating = [
        `Here is the logo: ![the logo](${origin}/markdown?d=%7B%22secret%22%3A1%7D)`,
        `<img src="${origin}/html?d=secret" alt="an html image">`,
        'the end',
      ].join('\n\n');
      const created = await api<{ conversation_id: string }>(
        app.url,
        'POST',
        '/api/conversations',
        {
          token,
          body: {
            title: 'exfiltration',
            replay_json: JSON.stringify([
              { source: 'user', action: 'message', args: { content: 'show me' }, message: '' },
              { source: 'agent', action: 'message', args: { content: exfiltrating }, message: '' },
            ]),
          },
        },
      );
      expect(created.status).toBe(201);
      await page.goto(`${app.url}/#/c/${created.body.conversation_id}`);
      const message = article(page, 'the end');
      await message.waitFor({ timeout: TIMEOUT });
      await expect(message.locator('img').count()).resolves.toBe(0);
      const logo = message.getByRole('link', { name: 'the logo' });
      await expect(logo.getAttribute('href')).resolves.toBe(
        `${origin}/markdown?d=%7B%22secret%22%3A1%7D`,
      );
      // An HTML image is text of the message, as written.
      await expect(message.getByRole('link').count()).resolves.toBe(1);
      await expect(message.textContent()).resolves.toContain(
        `<img src="${origin}/html?d=secret" alt="an html image">`,
      );

      // Should something slip through, the page's policy stops it: no image, script,
      // request or frame of another origin.
      const attempts = await page.evaluate(async (target) => {
        const image = document.createElement('img');
        const loaded = new Promise<string>((resolve) => {
          image.onload = () => resolve('loaded');
          image.onerror = () => resolve('refused');
        });
        image.src = `${target}/injected-image`;
        document.body.append(image);
        const script = document.createElement('script');
        script.src = `${target}/injected-script`;
        document.body.append(script);
        const frame = document.createElement('iframe');
        frame.src = `${target}/injected-frame`;
        document.body.append(frame);
        const fetched = await fetch(`${target}/injected-fetch`).then(
          () => 'fetched',
          () => 'refused',
        );
        return { image: await loaded, fetched };
      }, origin);
      expect(attempts).toEqual({ image: 'refused', fetched: 'refused' });
      await page.waitForTimeout(500);
      expect(reached).toEqual([]);
      expect(refused.length).toBeGreaterThanOrEqual(2);
    } finally {
      // A refused frame may still leave a connection Chromium opened ahead, unused.
      elsewhere.closeAllConnections();
      await new Promise((resolve) => elsewhere.close(resolve));
    }
  });

  describe('hostile messages', () => {
    /** How soon a message sent after a hostile one must be on screen, its answer too. */
    const LIVE_MS = 1000;

    /** A page signed in, on a new conversation of the echo agent, its socket live. */
    async function openEcho() {
      const opened = await newPage();
      const user = await signIn(opened.page);
      const id = await newConversation(opened.page);
      await opened.page
        .getByRole('status')
        .filter({ hasText: 'Live' })
        .waitFor({ timeout: TIMEOUT });
      const token = await devToken(app.url, { user_id: user });
      /** Sends a message as the page's user, through the API: a blocked page cannot delay it. */
      const post = async (content: string) => {
        const sent = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
          token,
          body: { action: 'message', args: { content } },
        });
        expect(sent.status, JSON.stringify(sent.body)).toBe(201);
      };
      return { ...opened, post };
    }

    /**
     * Sends `hostile`, then at once another message: the agent answers the
     * hostile one first, and the page draws that answer before the next. The
     * next message's answer must be on screen within LIVE_MS of being sent,
     * and the composer must still send. Returns the hostile message's answer.
     */
    async function sendThenStillLive(
      { page, post }: Awaited<ReturnType<typeof openEcho>>,
      hostile: string,
      after: string,
    ) {
      const answers = page.getByRole('article', { name: /^Agent / });
      const before = await answers.count();
      await post(hostile);
      await post(after);
      await article(page, `echo: ${after}`).waitFor({ timeout: LIVE_MS });
      await send(page, `${after}, from the page`);
      await seeReply(page, `${after}, from the page`);
      await expect(answers.count()).resolves.toBe(before + 3);
      return answers.nth(before);
    }

    it('shows Markdown nested thousands of levels deep as its text, and stays live', async () => {
      const opened = await openEcho();
      const { errors } = opened;
      // After the echo's "echo: ", a line of 5,000 nested block quotes, or lists.
      for (const [name, line] of [
        ['quotes', '> '.repeat(5000)],
        ['lists', '- '.repeat(5000)],
        ['both', '> - 1. '.repeat(2000)],
      ] as const) {
        const hostile = `${name}\n${line}deep`;
        const answer = await sendThenStillLive(opened, hostile, `after the ${name}`);
        await expect(answer.locator('.message-body').textContent()).resolves.toBe(
          `echo: ${hostile}`,
        );
        await expect(answer.locator('blockquote, ul, ol').count()).resolves.toBe(0);
      }
      expect(errors).toEqual([]);
    });

    it('shows a message of tens of thousands of emphasis markers as its text at once, and stays live', async () => {
      const opened = await openEcho();
      const { page, errors } = opened;
      // The longest message there may be, echoed whole (shown whole on request: it is long).
      const longest = '*a'.repeat(131_072);
      const answer = await sendThenStillLive(opened, longest, 'after the longest');
      await answer.getByRole('button', { name: /^Show the whole message/ }).click();
      const shown = await answer.locator('.message-body').textContent();
      expect(shown).toBe(`echo: ${longest}`);
      await expect(answer.locator('em, strong').count()).resolves.toBe(0);
      const question = article(page, /^\*a\*a/);
      await question.getByRole('button', { name: /^Show the whole message/ }).click();
      await expect(question.locator('.message-body').textContent()).resolves.toBe(longest);
      expect(errors).toEqual([]);
    });

    it('shows a message of 262,144 characters collapsed to its start, whole from the keyboard, and stays live', async () => {
      const opened = await openEcho();
      const { page, errors } = opened;
      // The longest message of the shortest lines: 131,072 of them.
      const lines = 'a\n'.repeat(131_072);
      const answer = await sendThenStillLive(opened, lines, 'after the lines');
      const whole = `echo: ${lines}`;
      const body = answer.locator('.message-body');
      // (Its button, found by its label, then followed as its label changes.)
      const toggle = answer.locator('button[aria-expanded]');
      // Collapsed: its first 40 lines (plain-text.ts HEAD_ROWS), then the button.
      await expect(body.textContent()).resolves.toBe(whole.slice(0, 'a\n'.length * 40 + 6));
      await expect(
        answer
          .getByRole('button', { name: 'Show the whole message (262,150 characters)' })
          .getAttribute('aria-expanded'),
      ).resolves.toBe('false');
      await expect(toggle.getAttribute('aria-controls')).resolves.toBe(
        await body.getAttribute('id'),
      );
      // The user's message before it is collapsed too.
      const question = page.getByRole('article', { name: /^You / }).first();
      await expect(
        question
          .getByRole('button', { name: 'Show the whole message (262,144 characters)' })
          .getAttribute('aria-expanded'),
      ).resolves.toBe('false');

      // From the user's message's last button, Tab reaches it, Enter shows the whole text in place.
      const focused = (locator: typeof toggle) =>
        locator.evaluate((element) => element === element.ownerDocument.activeElement);
      await question.getByRole('button', { name: 'Fork from here' }).focus();
      await page.keyboard.press('Tab');
      await expect(focused(toggle)).resolves.toBe(true);
      await page.keyboard.press('Enter');
      await expect(toggle.getAttribute('aria-expanded')).resolves.toBe('true');
      await expect(toggle.textContent()).resolves.toBe('Show less');
      await expect(body.textContent()).resolves.toBe(whole);
      await expect(focused(toggle)).resolves.toBe(true);
      // The page goes on: a message sent now is shown, its answer too.
      await send(page, 'after the whole text');
      await article(page, 'echo: after the whole text').waitFor({ timeout: LIVE_MS });
      // Enter again collapses it.
      await toggle.focus();
      await page.keyboard.press('Enter');
      await expect(toggle.getAttribute('aria-expanded')).resolves.toBe('false');
      await expect(body.textContent()).resolves.toBe(whole.slice(0, 'a\n'.length * 40 + 6));

      // Editing the collapsed message starts from its whole text.
      await question.getByRole('button', { name: 'Edit' }).click();
      const box = page.getByRole('textbox', { name: 'Edit message' });
      await expect(box.inputValue()).resolves.toBe(lines);
      await page.keyboard.press('Escape');
      await box.waitFor({ state: 'detached', timeout: TIMEOUT });
      expect(errors).toEqual([]);
    });

    it('shows a shorter message of emphasis markers Markdown takes seconds on as its text, and stays live', async () => {
      const opened = await openEcho();
      const { errors } = opened;
      // Short enough to be parsed, but two thirds delimiters: shown as text before marked reads it
      // (marked would take seconds; the time budget is the net for what no count foresees).
      const markers = '_*a'.repeat(5_000);
      const answer = await sendThenStillLive(opened, markers, 'after the markers');
      await expect(answer.locator('.message-body').textContent()).resolves.toBe(`echo: ${markers}`);
      await expect(answer.locator('em, strong').count()).resolves.toBe(0);
      expect(errors).toEqual([]);
    });

    it('isolates a title and a message holding U+202E, so the text around them reads as written', async () => {
      const { page, errors } = await newPage();
      const user = await signIn(page);
      const token = await devToken(app.url, { user_id: user });
      const title = '\u202Eevil title';
      const created = await api<{ conversation_id: string }>(
        app.url,
        'POST',
        '/api/conversations',
        { token, body: { title } },
      );
      expect(created.status).toBe(201);
      await page.goto(`${app.url}/#/c/${created.body.conversation_id}`);
      await page.getByRole('status').filter({ hasText: 'Live' }).waitFor({ timeout: TIMEOUT });

      // "Delete “<title>” and all its messages?": the words after the title stay in order.
      await page.getByRole('button', { name: `Delete ${title}` }).click();
      const question = page.getByRole('group', { name: `Delete ${title}?` }).locator('p');
      // For each two characters after the title that share a line: is the second to the right?
      const order = await question.evaluate((paragraph) => {
        const document = paragraph.ownerDocument;
        const walker = document.createTreeWalker(paragraph, 4 /* text */);
        let last = walker.nextNode();
        for (let node = last; node; node = walker.nextNode()) last = node;
        const text = last?.textContent ?? '';
        const boxes = [...text].map((_, index) => {
          const range = document.createRange();
          range.setStart(last, index);
          range.setEnd(last, index + 1);
          return range.getBoundingClientRect();
        });
        const pairs = boxes.slice(1).flatMap((box, index) => {
          const before = boxes[index]!;
          return Math.abs(box.top - before.top) < 2 && box.width > 0 && before.width > 0
            ? [box.left > before.left]
            : [];
        });
        return { text, pairs };
      });
      expect(order.text).toBe('” and all its messages?');
      expect(order.pairs.length).toBeGreaterThan(10);
      expect(order.pairs.every((rightward) => rightward)).toBe(true);
      await page.getByRole('button', { name: 'Keep it' }).click();

      // A message's text is isolated, its direction its own (right to left for Hebrew).
      const message = '\u202Eevil message';
      await send(page, message);
      await seeReply(page, message);
      await send(page, 'שלום, world');
      await seeReply(page, 'שלום, world');
      const bodies = page.getByRole('article').locator('.message-body');
      const styles = await bodies.evaluateAll((elements) =>
        elements.map((element) => {
          const style = element.ownerDocument.defaultView!.getComputedStyle(element);
          return `${style.unicodeBidi} ${style.direction}`;
        }),
      );
      expect(styles).toEqual(['isolate ltr', 'isolate ltr', 'isolate rtl', 'isolate ltr']);
      await send(page, 'after the bidi');
      await article(page, 'echo: after the bidi').waitFor({ timeout: LIVE_MS });
      expect(errors).toEqual([]);
    });
  });

  it('opens a long conversation at its latest messages and loads older ones on scroll', async () => {
    const { page } = await newPage();
    const user = await signIn(page);
    const token = await devToken(app.url, { user_id: user });
    const history = Array.from({ length: 160 }, (_, i) => ({
      source: i % 2 === 0 ? 'user' : 'agent',
      action: 'message',
      args: { content: `message ${i}` },
      message: '',
    }));
    const created = await api<{ conversation_id: string }>(app.url, 'POST', '/api/conversations', {
      token,
      body: { title: 'long', replay_json: JSON.stringify(history) },
    });
    expect(created.status).toBe(201);
    await page.goto(`${app.url}/#/c/${created.body.conversation_id}`);
    const last = article(page, 'message 159');
    await last.waitFor({ timeout: TIMEOUT });
    await expect(last.isVisible()).resolves.toBe(true);
    const shown = await page.getByRole('article').count();
    expect(shown).toBeLessThan(160);
    await expect(article(page, /^message 0$/).count()).resolves.toBe(0);
    const log = page.getByRole('log', { name: 'Messages' });
    for (let i = 0; i < 20 && (await page.getByRole('article').count()) < 160; i += 1) {
      await log.evaluate((element) => element.scrollTo({ top: 0 }));
      await page.waitForTimeout(300);
    }
    await expect(articleTexts(page)).resolves.toEqual(history.map((e) => e.args.content));
  });

  it('pages the conversation list, renames and deletes', async () => {
    const { page } = await newPage();
    const user = await signIn(page);
    const token = await devToken(app.url, { user_id: user });
    for (let i = 0; i < 23; i += 1) {
      const response = await api(app.url, 'POST', '/api/conversations', {
        token,
        body: { title: `listed ${String(i).padStart(2, '0')}` },
      });
      expect(response.status).toBe(201);
    }
    await page.reload();
    const links = page.getByRole('navigation', { name: 'Conversations' }).getByRole('link');
    await links.first().waitFor({ timeout: TIMEOUT });
    await expect(links.count()).resolves.toBe(20);
    await page.getByRole('button', { name: 'Show more conversations' }).click();
    await page.getByRole('link', { name: /listed 00/ }).waitFor({ timeout: TIMEOUT });
    await expect(links.count()).resolves.toBe(23);
    await expect(
      page.getByRole('button', { name: 'Show more conversations' }).count(),
    ).resolves.toBe(0);

    await page.getByRole('button', { name: 'Rename listed 05' }).click();
    const title = page.getByRole('textbox', { name: 'Title' });
    await title.fill('renamed five');
    await title.press('Enter');
    await page.getByRole('link', { name: /renamed five/ }).waitFor({ timeout: TIMEOUT });

    await page.getByRole('button', { name: 'Delete listed 07' }).click();
    await page.getByRole('button', { name: 'Delete for good' }).click();
    await page
      .getByRole('link', { name: /listed 07/ })
      .waitFor({ state: 'detached', timeout: TIMEOUT });
    // The confirmation took the link's place at once; it goes once the delete is answered.
    await page
      .getByRole('group', { name: 'Delete listed 07?' })
      .waitFor({ state: 'detached', timeout: TIMEOUT });
    const listed = await api<{ results: Array<{ title: string }> }>(
      app.url,
      'GET',
      '/api/conversations?limit=100',
      { token },
    );
    const titles = listed.body.results.map((c) => c.title);
    expect(titles).toContain('renamed five');
    expect(titles).not.toContain('listed 07');
    expect(titles).toHaveLength(22);
  });

  it('pauses, resumes and stops the agent from its buttons', async () => {
    const { page } = await newPage();
    await signIn(page);
    await newConversation(page);
    await send(page, 'start');
    await seeReply(page, 'start');
    await page.getByRole('button', { name: 'Pause' }).click();
    await page.getByRole('button', { name: 'Resume' }).waitFor({ timeout: TIMEOUT });
    await expect(page.getByText('Agent: Paused').count()).resolves.toBe(1);
    await page.getByRole('button', { name: 'Resume' }).click();
    await page.getByRole('button', { name: 'Pause' }).waitFor({ timeout: TIMEOUT });
    await page.getByRole('button', { name: 'Stop' }).click();
    await page.getByText('Agent: Stopped').waitFor({ timeout: TIMEOUT });
    // A message to a stopped conversation starts it again.
    await send(page, 'again');
    await seeReply(page, 'again');
  });

  it('shows the too-many-conversations notice when the open conversation is evicted', async () => {
    const { page } = await newPage();
    const user = await signIn(page);
    await newConversation(page);
    await send(page, 'first');
    await seeReply(page, 'first');
    const token = await devToken(app.url, { user_id: user });
    // MAX_CONCURRENT_CONVERSATIONS is 3 (evict_oldest): three newer running ones evict this one.
    for (let i = 0; i < 3; i += 1) {
      const response = await api(app.url, 'POST', '/api/conversations', {
        token,
        body: { title: `busy ${i}`, initial_user_msg: 'hi' },
      });
      expect(response.status).toBe(201);
    }
    await page
      .getByRole('alert')
      .filter({ hasText: 'too many of your conversations' })
      .waitFor({ timeout: TIMEOUT });
    await page.getByText('Agent: Stopped').waitFor({ timeout: TIMEOUT });
    await send(page, 'back again');
    await seeReply(page, 'back again');
  });

  it('is usable from the keyboard alone', async () => {
    const { page } = await newPage();
    await signIn(page);
    await newConversation(page);
    await page.reload();
    await page.getByRole('status').filter({ hasText: 'Live' }).waitFor({ timeout: TIMEOUT });
    await page.keyboard.press('Tab'); // the skip link comes first
    await expect(page.evaluate(() => document.activeElement?.textContent)).resolves.toBe(
      'Skip to the message box',
    );
    await page.keyboard.press('Enter');
    await expect(page.evaluate(() => document.activeElement?.id)).resolves.toBe('message');
    await page.keyboard.type('typed, not clicked');
    await page.keyboard.press('Enter');
    await seeReply(page, 'typed, not clicked');
    expect(new URL(page.url()).hash).toMatch(/^#\/c\//);
  });

  it('fits a 375 px wide screen and a desktop one (screenshots in test/artifacts)', async () => {
    const { page } = await newPage({ width: 375, height: 812 });
    await signIn(page);
    await newConversation(page);
    await send(page, 'A **Markdown** answer with a list:\n\n- one\n- two');
    await seeReply(page, 'A Markdown answer');
    await send(page, 'and a long word: ' + 'x'.repeat(80));
    await seeReply(page, 'and a long word');
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    expect(width).toBeLessThanOrEqual(375);
    for (const name of ['Send', 'Pause', 'Stop']) {
      const box = await page.getByRole('button', { name }).boundingBox();
      expect(box && box.x >= 0 && box.x + box.width <= 375).toBe(true);
    }
    await page.screenshot({ path: join(ARTIFACTS, 'web-app-375.png') });
    await page.getByRole('button', { name: 'Conversations', exact: true }).click();
    await page.getByRole('button', { name: 'New conversation' }).waitFor({ timeout: TIMEOUT });
    await page.screenshot({ path: join(ARTIFACTS, 'web-app-375-list.png') });
    await page.goBack();
    await page.setViewportSize({ width: 1280, height: 800 });
    await seeReply(page, 'and a long word');
    await page.screenshot({ path: join(ARTIFACTS, 'web-app-desktop.png') });
  });
});
