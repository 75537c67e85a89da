// What a browser user gets: the client SDK's size and the web app's initial
// JavaScript (web/scripts/measure-sizes.mjs, on what `npm run build` built),
// and, in headless Chromium (playwright-core driving Debian's chromium), how
// long the web app takes to open a 10,000-event conversation to its latest
// events, how long a streamed delta takes from reaching the page to being
// painted, and how long the worst of a set of hostile messages (262,144
// characters of deep nesting, emphasis markers, backticks, brackets, links,
// lines, prose; and as long as Markdown is parsed, 16,384) takes from reaching
// the page to being painted, and to render (the page's `cs:render-message`
// User Timing measure). A message that long is shown collapsed to its start
// (web/src/plain-text.ts): how long it takes to show it whole, from its button
// being pressed to being painted, is measured too, for information.
/* global window, document, location, innerHeight, requestAnimationFrame, MutationObserver, addEventListener -- pageProbe, openAndWait, answerPainted and the evaluated callbacks run in the page */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { api, createConversation, postMessage, stopConversation } from '../lib/client.mjs';
import { ROOT } from '../lib/cluster.mjs';
import { EVENTS_PER_TURN, openHistoryStore, seedHistory, turnText } from '../lib/history.mjs';
import { formatCpu, startCpuMeter } from '../lib/proc.mjs';
import { formatSummary, summarize } from '../lib/stats.mjs';
import { PACER_AGENT } from './streaming.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const CHROMIUM_ARGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];
const TENANT = 'bench';
const USER = 'browser';
const OPEN_TIMEOUT_MS = 30_000;

/** Runs web/scripts/measure-sizes.mjs and returns what it printed (it exits 1 when a target is missed). */
function measureSizes() {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(ROOT, 'web/scripts/measure-sizes.mjs')], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    let errors = '';
    child.stdout.on('data', (data) => (output += data.toString()));
    child.stderr.on('data', (data) => (errors += data.toString()));
    child.on('error', reject);
    child.on('exit', (code) => {
      try {
        resolve(JSON.parse(output));
      } catch {
        reject(new Error(`measure-sizes.mjs exited ${code}: ${(errors || output).slice(0, 300)}`));
      }
    });
  });
}

export async function runSizes(ctx) {
  const { log } = ctx;
  const sizes = await measureSizes();
  const result = {
    sdkMinifiedBytes: sizes.sdk_minified_bytes,
    sdkGzippedBytes: sizes.sdk_gzipped_bytes,
    appGzippedBytes: sizes.app_initial_js_gzipped_bytes,
    appFiles: sizes.app_initial_files,
  };
  log(
    `  SDK (libs/client/dist with socket.io-client): ${result.sdkMinifiedBytes} bytes minified,` +
      ` ${result.sdkGzippedBytes} bytes gzipped`,
  );
  log(
    `  web app initial JavaScript (${result.appFiles.join(', ')}): ${result.appGzippedBytes} bytes gzipped`,
  );
  return result;
}

/**
 * Put into every page before its scripts: records when each WebSocket frame
 * holding streamed deltas arrived (by the emit stamps of bench_pacer inside),
 * and, watching the DOM, when each stamp was first on screen: the first task
 * after the animation frame that follows its insertion (the frame is painted
 * by then).
 */
function pageProbe() {
  const arrived = new Map();
  const painted = [];
  const pendingPaint = new Set();
  const seen = new Set();
  const answers = [];
  window.__bench = { arrived, painted, answers };
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', (event) => {
        if (typeof event.data !== 'string') return;
        if (
          !event.data.includes('"stream":true') &&
          event.data.includes('"source":"agent"') &&
          event.data.includes('"action":"message"')
        ) {
          answers.push(performance.now());
          return;
        }
        if (!event.data.includes('"stream":true')) return;
        const at = performance.now();
        for (const match of event.data.matchAll(/"delta":"([^"]*)"/g)) {
          for (const stamp of match[1].split(' '))
            if (stamp && !arrived.has(stamp)) arrived.set(stamp, at);
        }
      });
    }
  };
  const check = () => {
    let fresh = false;
    for (const element of document.querySelectorAll('[data-streaming="true"] .message-text')) {
      for (const stamp of (element.textContent ?? '').split(' ')) {
        if (!stamp || seen.has(stamp) || !arrived.has(stamp)) continue;
        seen.add(stamp);
        pendingPaint.add(stamp);
        fresh = true;
      }
    }
    if (!fresh) return;
    requestAnimationFrame(() =>
      setTimeout(() => {
        const at = performance.now();
        for (const stamp of pendingPaint) painted.push(at - arrived.get(stamp));
        pendingPaint.clear();
      }, 0),
    );
  };
  const start = () => {
    new MutationObserver(check).observe(document.body, {
      subtree: true,
      childList: true,
      characterData: true,
    });
  };
  if (document.body) start();
  else addEventListener('DOMContentLoaded', start);
}

/**
 * In the page: opens the conversation (`#/c/<id>`) and resolves, in ms, once
 * an element matching `selector` that holds `text` is on screen (painted).
 */
function openAndWait({ id, text, selector, timeoutMs }) {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const visible = () => {
      for (const element of document.querySelectorAll(selector)) {
        if (!(element.textContent ?? '').includes(text)) continue;
        const box = element.getBoundingClientRect();
        if (box.height > 0 && box.bottom > 0 && box.top < innerHeight) return true;
      }
      return false;
    };
    const timer = setTimeout(() => {
      observer.disconnect();
      reject(new Error(`"${text}" not on screen within ${timeoutMs} ms`));
    }, timeoutMs);
    const observer = new MutationObserver(() => {
      if (!visible()) return;
      observer.disconnect();
      clearTimeout(timer);
      requestAnimationFrame(() => setTimeout(() => resolve(performance.now() - started), 0));
    });
    observer.observe(document.body, { subtree: true, childList: true, characterData: true });
    location.hash = `#/c/${id}`;
  });
}

/** Hostile messages: each is sent to the echo agent, whose answer repeats it (cut to 262,144 characters). */
const MESSAGE_CHARS = 262_144;
/** web/src/markdown.ts MARKDOWN_MAX_CHARS: the longest message parsed as Markdown, so timed. */
const MARKDOWN_MAX_CHARS = 16_384;
const HOSTILE = {
  'nested block quotes': (n) => `q\n${'> '.repeat(n)}`,
  'nested lists': (n) => `l\n${'- '.repeat(n)}`,
  '*a': (n) => '*a'.repeat(n),
  _a: (n) => '_a'.repeat(n),
  '_*a': (n) => '_*a'.repeat(n),
  '**a': (n) => '**a'.repeat(n),
  backticks: (n) => '`a'.repeat(n),
  brackets: (n) => '['.repeat(n),
  links: (n) => '[a](b '.repeat(n),
  'mixed markers': (n) => '*_`[<~'.repeat(n),
  '> a lines': (n) => '> a\n'.repeat(n),
  'a lines': (n) => 'a\n'.repeat(n),
  table: (n) => `|a|b|\n|-|-|\n${'|x|y|\n'.repeat(n)}`,
  prose: (n) => 'The quick brown fox jumps over the lazy dog. '.repeat(n),
  'Markdown document': (n) =>
    '## Heading\n\nSome **bold**, *em*, `code` and [a link](https://example.com).\n\n- one\n- two\n  - nested\n\n```js\nconst x = 1;\n```\n\n> quoted\n\n'.repeat(
      n,
    ),
};

/** `make(n)` long enough, cut to `chars`. */
function sized(make, chars) {
  let n = 1;
  while (make(n).length < chars) n *= 2;
  return make(n).slice(0, chars);
}

/**
 * In the page: resolves once `count` agent messages are on screen (painted),
 * with how long the last took from its WebSocket frame, and its render measure.
 */
function answerPainted({ count, timeoutMs }) {
  return new Promise((resolve, reject) => {
    const done = () => document.querySelectorAll('.log article.message.agent').length >= count;
    const timer = setTimeout(() => {
      observer.disconnect();
      reject(new Error(`answer ${count} not on screen within ${timeoutMs} ms`));
    }, timeoutMs);
    const observer = new MutationObserver(() => {
      if (!done()) return;
      observer.disconnect();
      clearTimeout(timer);
      requestAnimationFrame(() =>
        setTimeout(() => {
          const at = performance.now();
          const measures = performance.getEntriesByName('cs:render-message');
          const render = measures.at(-1);
          resolve({
            painted: at - window.__bench.answers.at(-1),
            render: render?.duration ?? null,
            plain: render?.detail?.plain ?? null,
          });
        }, 0),
      );
    });
    observer.observe(document.body, { subtree: true, childList: true });
  });
}

/**
 * In the page: presses the button that shows the answer whole, if it is
 * collapsed, and resolves with how long it took to be painted (null if it was
 * not collapsed).
 */
function expandPainted() {
  return new Promise((resolve) => {
    const button = document.querySelector(
      '.log article.message.agent button[aria-expanded="false"]',
    );
    if (!button) return resolve(null);
    const started = performance.now();
    button.click();
    requestAnimationFrame(() => setTimeout(() => resolve(performance.now() - started), 0));
  });
}

/** Each hostile message at MESSAGE_CHARS and at MARKDOWN_MAX_CHARS, into an open echo conversation. */
/** A quick run sends these alone. */
const QUICK_HOSTILE = ['nested block quotes', '_*a', '> a lines', 'Markdown document'];

async function measureHostile(page, gateway, token, ids, log, quick) {
  const results = [];
  const contents = Object.entries(HOSTILE).filter(
    ([name]) => !quick || QUICK_HOSTILE.includes(name),
  );
  // The echo's answer is "echo: " and the message: at the Markdown limit, 6 characters fewer.
  for (const chars of [MESSAGE_CHARS, MARKDOWN_MAX_CHARS - 'echo: '.length]) {
    for (const [name, make] of contents) {
      // Each in a conversation of its own: the figure is the message's, not the page's so far.
      const id = await createConversation(gateway.url, token, { title: `hostile ${name}` });
      ids.push(id);
      await page.evaluate(openAndWait, {
        id,
        text: 'No messages yet',
        selector: '.log .empty',
        timeoutMs: OPEN_TIMEOUT_MS,
      });
      await page.getByText('Live', { exact: true }).waitFor({ timeout: OPEN_TIMEOUT_MS });
      const painted = page.evaluate(answerPainted, { count: 1, timeoutMs: OPEN_TIMEOUT_MS });
      await postMessage(gateway.url, token, id, sized(make, chars));
      const shown = await painted;
      results.push({ name, chars, ...shown, expanded: await page.evaluate(expandPainted) });
      await stopConversation(gateway.url, token, id).catch(() => undefined);
    }
  }
  const worst = results.reduce((a, b) => (b.painted > a.painted ? b : a));
  const worstRender = results.reduce((a, b) => ((b.render ?? 0) > (a.render ?? 0) ? b : a));
  const collapsed = results.filter((result) => result.expanded !== null);
  const worstExpanded = collapsed.reduce((a, b) => (b.expanded > a.expanded ? b : a), collapsed[0]);
  for (const result of results) {
    log(
      `    ${String(result.chars).padStart(7)} chars of ${result.name}: render ${result.render?.toFixed(1)} ms` +
        ` (${result.plain ? `plain text: ${result.plain}` : 'Markdown'}), reached the page → painted ${result.painted.toFixed(1)} ms` +
        (result.expanded === null
          ? ''
          : `; shown whole → painted ${result.expanded.toFixed(1)} ms`),
    );
  }
  log(
    `  worst hostile message: ${worst.chars} chars of ${worst.name}, reached the page → painted ${worst.painted.toFixed(1)} ms;` +
      ` worst render ${worstRender.render?.toFixed(1)} ms (${worstRender.chars} chars of ${worstRender.name})`,
  );
  if (worstExpanded) {
    log(
      `  worst collapsed message shown whole (its button pressed → painted): ${worstExpanded.expanded.toFixed(1)} ms` +
        ` (${worstExpanded.chars} chars of ${worstExpanded.name}; ${collapsed.length} collapsed)`,
    );
  }
  return {
    messages: results.length,
    worst: { name: worst.name, chars: worst.chars, painted: round(worst.painted) },
    worstRender: {
      name: worstRender.name,
      chars: worstRender.chars,
      render: round(worstRender.render ?? 0),
    },
    worstExpanded: worstExpanded
      ? {
          name: worstExpanded.name,
          chars: worstExpanded.chars,
          expanded: round(worstExpanded.expanded),
          collapsed: collapsed.length,
        }
      : null,
    results: results.map((result) => ({
      ...result,
      painted: round(result.painted),
      render: result.render === null ? null : round(result.render),
      expanded: result.expanded === null ? null : round(result.expanded),
    })),
  };
}

const round = (value) => Math.round(value * 100) / 100;

export async function runBrowser(ctx) {
  const { cluster, options, log } = ctx;
  if (!existsSync(CHROMIUM))
    throw new Error(`no Chromium at ${CHROMIUM} (apt-get install chromium)`);
  const gateway = cluster.gateways[0];
  const token = await ctx.token(USER);
  const events = options.historyEvents;
  const opens = options.quick ? 2 : 5;
  const ids = [];
  const opened = await openHistoryStore(cluster);
  let browser = null;
  try {
    // A conversation of `events` events.
    const longId = await createConversation(gateway.url, token, { title: 'browser long history' });
    ids.push(longId);
    const info = await api(gateway.url, token, 'GET', `/api/conversations/${longId}`);
    const { turns } = await seedHistory(opened.store, TENANT, longId, info.last_event_id, events);
    const lastAnswer = turnText(turns - 1).answer.slice(0, 60);
    // And one that streams.
    const streamId = await createConversation(gateway.url, token, {
      title: 'browser stream',
      agent: PACER_AGENT,
      agent_config: { rate: 50, count: 250 },
    });
    ids.push(streamId);

    browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS,
    });
    const page = await (
      await browser.newContext({ viewport: { width: 1280, height: 800 } })
    ).newPage();
    await page.addInitScript(({ session }) => localStorage.setItem('cs.session', session), {
      session: JSON.stringify({ token }),
    });
    await page.addInitScript(pageProbe);
    await page.goto(`${gateway.url}/`);
    await page
      .getByRole('heading', { name: 'Conversations' })
      .waitFor({ timeout: OPEN_TIMEOUT_MS });

    // Open the long conversation, then back to the list, `opens` times.
    const meter = startCpuMeter(() => cluster.meterTargets());
    const openTimes = [];
    for (let i = 0; i < opens; i += 1) {
      openTimes.push(
        await page.evaluate(openAndWait, {
          id: longId,
          text: lastAnswer,
          selector: '.log .message',
          timeoutMs: OPEN_TIMEOUT_MS,
        }),
      );
      await page.evaluate(() => (location.hash = ''));
      await page.getByText('No conversation open').waitFor({ timeout: OPEN_TIMEOUT_MS });
    }
    const openCpu = meter.stop();
    const open = summarize(openTimes);
    log(
      `  open a conversation of ${info.last_event_id + 1 + turns * EVENTS_PER_TURN} events → its latest on screen  ${formatSummary(open)}`,
    );

    // Stream into the open page: one turn of 250 deltas at 50/s (two in a full run).
    await page.evaluate(openAndWait, {
      id: streamId,
      text: 'No messages yet',
      selector: '.log .empty',
      timeoutMs: OPEN_TIMEOUT_MS,
    });
    await page.getByText('Live', { exact: true }).waitFor({ timeout: OPEN_TIMEOUT_MS });
    const streamTurns = options.quick ? 1 : 2;
    for (let i = 0; i < streamTurns; i += 1) {
      await api(gateway.url, token, 'POST', `/api/conversations/${streamId}/events`, {
        action: 'message',
        args: { content: JSON.stringify({ rate: 50, count: options.quick ? 50 : 250 }) },
      });
      await page
        .getByText(/^\d+ deltas$/)
        .nth(i)
        .waitFor({ timeout: OPEN_TIMEOUT_MS });
    }
    const { painted, arrived } = await page.evaluate(() => ({
      painted: window.__bench.painted,
      arrived: window.__bench.arrived.size,
    }));
    const paint = summarize(painted);
    log(
      `  streamed delta reached the page → painted  ${formatSummary(paint)} (${arrived} deltas arrived)`,
    );
    log(`  ${formatCpu(openCpu)}`);

    const hostile = await measureHostile(page, gateway, token, ids, log, options.quick);
    return {
      hostile,
      events: info.last_event_id + 1 + turns * EVENTS_PER_TURN,
      open,
      paint,
      deltasArrived: arrived,
      cpu: openCpu,
      viewport: '1280×800',
    };
  } finally {
    await browser?.close().catch(() => undefined);
    await opened.close();
    for (const id of ids) await stopConversation(gateway.url, token, id).catch(() => undefined);
  }
}
