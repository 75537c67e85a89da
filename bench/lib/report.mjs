// Results on disk: bench/results/<date>.json (merged per scenario over the
// day's full-size runs), BENCHMARKS.md at the repository root, and an SVG of
// latency percentiles against load.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { cpus, release, totalmem } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { Redis } from 'ioredis';
import { ROOT } from './cluster.mjs';
import { builtPathBudget, roundTripBudget } from '../scenarios/building-blocks.mjs';
import { round } from './stats.mjs';
import { latencyChartSvg } from './chart.mjs';
import { activitySummary } from './pg-activity.mjs';
import { STEP_P99_MS as STREAM_STEP_P99_MS } from '../scenarios/streaming.mjs';
import { lifecycleResults, lifecycleTargets } from './report-lifecycle.mjs';

const RESULTS_DIR = join(ROOT, 'bench', 'results');

async function serverVersions(cluster) {
  const versions = { postgres: null, redis: null };
  const client = new pg.Client({ connectionString: cluster.adminUrl });
  try {
    await client.connect();
    versions.postgres = (await client.query('SHOW server_version')).rows[0].server_version;
  } catch {
    // unknown
  } finally {
    await client.end().catch(() => undefined);
  }
  const redis = new Redis(cluster.redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
  try {
    await redis.connect();
    versions.redis = /redis_version:(\S+)/.exec(await redis.info('server'))?.[1] ?? null;
  } catch {
    // unknown
  } finally {
    redis.disconnect();
  }
  return versions;
}

/** The commit the services were built from, and whether apps/ or libs/ had local changes. */
function sourceVersion() {
  try {
    const git = (...args) => execFileSync('git', args, { cwd: ROOT, encoding: 'utf8' }).trim();
    return {
      commit: git('rev-parse', '--short', 'HEAD'),
      localChanges: git('status', '--porcelain', '--', 'apps', 'libs').length > 0,
    };
  } catch {
    return null;
  }
}

async function machine(cluster) {
  const cpuList = cpus();
  return {
    cpu: cpuList[0]?.model ?? 'unknown',
    cores: cpuList.length,
    memoryGiB: round(totalmem() / 1024 ** 3),
    kernel: release(),
    node: process.version,
    ...(await serverVersions(cluster)),
  };
}

/** Writes BENCHMARKS.md and the chart again from a day's results file (no new measurement). */
export function renderFromResults(file) {
  const data = JSON.parse(readFileSync(file, 'utf8'));
  const written = [];
  let chart = null;
  const levels = data.scenarios.sustained?.levels;
  if (levels?.length) {
    chart = `bench/results/${data.date}-sustained.svg`;
    writeFileSync(join(ROOT, chart), latencyChartSvg(levels));
    written.push(join(ROOT, chart));
  }
  writeFileSync(join(ROOT, 'BENCHMARKS.md'), renderMarkdown(data, chart));
  written.push(join(ROOT, 'BENCHMARKS.md'));
  return written;
}

/** The newest full-size results file (`<date>.json`), or null. */
export function latestResults() {
  if (!existsSync(RESULTS_DIR)) return null;
  const files = readdirSync(RESULTS_DIR)
    .filter((name) => /^\d{4}-\d{2}-\d{2}\.json$/.test(name))
    .sort();
  return files.length ? join(RESULTS_DIR, files[files.length - 1]) : null;
}

export async function writeReports({
  options,
  startedAt,
  elapsedS,
  loadAtStart,
  results,
  failures,
  cluster,
}) {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const date = startedAt.toISOString().slice(0, 10);
  const run = {
    startedAt: startedAt.toISOString(),
    elapsedS,
    loadAtStart,
    source: sourceVersion(),
    quick: options.quick,
    cluster: {
      gateways: options.gateways,
      workers: options.workers,
      leaseTtlMs: options.leaseTtlMs,
      workerConcurrency: options.workerConcurrency,
    },
    options,
  };
  const file = join(RESULTS_DIR, options.quick ? `${date}-quick.json` : `${date}.json`);
  // The first full run of a day starts from the newest results before it, so that
  // BENCHMARKS.md keeps showing the scenarios it did not run (each with its run's date).
  const latest = options.quick ? null : latestResults();
  const previous = existsSync(file)
    ? JSON.parse(readFileSync(file, 'utf8'))
    : latest
      ? JSON.parse(readFileSync(latest, 'utf8'))
      : null;
  const here = await machine(cluster);
  const merged = {
    date,
    machine: here,
    // Each run names its machine: scenarios kept from earlier runs may have
    // been measured on another one (those before runs named theirs were on
    // the machine their file names).
    runs: [
      ...(previous?.runs ?? []).map((earlier) => ({
        ...earlier,
        machine: earlier.machine ?? previous.machine,
      })),
      { ...run, machine: here, scenarios: Object.keys(results), failures },
    ],
    scenarios: { ...(previous?.scenarios ?? {}) },
    failures: { ...(previous?.failures ?? {}) },
  };
  for (const [name, result] of Object.entries(results)) {
    merged.scenarios[name] = { ...result, run: run.startedAt, cluster: run.cluster };
    delete merged.failures[name];
  }
  for (const [name, message] of Object.entries(failures)) {
    if (!results[name]) merged.failures[name] = { message, run: run.startedAt };
  }
  writeFileSync(file, `${JSON.stringify(merged, null, 2)}\n`);
  const written = [file];
  if (!options.quick) {
    const levels = merged.scenarios.sustained?.levels;
    let chart = null;
    if (levels?.length) {
      chart = `bench/results/${date}-sustained.svg`;
      writeFileSync(join(ROOT, chart), latencyChartSvg(levels));
      written.push(join(ROOT, chart));
    }
    const markdown = join(ROOT, 'BENCHMARKS.md');
    writeFileSync(markdown, renderMarkdown(merged, chart));
    written.push(markdown);
  }
  return written;
}

const clients = (n) => `${n} client${n === 1 ? '' : 's'}`;
/** A sustained level: closed loop (`10 clients`) or paced (`1000 clients at 1000 msg/s`). */
const levelName = (level) =>
  level.offeredRate
    ? `${clients(level.clients)} at ${level.offeredRate} msg/s`
    : clients(level.clients);
/** The `stop` scenario's two ways of cutting a turn, as the tables name them. */
const TURN_CUTS = { stop: 'a stop', interrupt: 'an interrupting message' };

const ms = (value) => (value === null || value === undefined ? '–' : `${value} ms`);
const ratio = (value, budget) =>
  value === null || value === undefined || !budget ? '–' : `×${(value / budget).toFixed(1)}`;

function row(cells) {
  return `| ${cells.map((c) => String(c ?? '–').replaceAll('|', '\\|')).join(' | ')} |`;
}

function latencyRow(scenario, measure, summary, throughput = '–', versus = '–', note = '') {
  return row([
    scenario,
    measure,
    ms(summary?.p50),
    ms(summary?.p95),
    ms(summary?.p99),
    throughput,
    versus,
    note,
  ]);
}

const CPU_COLUMNS = [
  'gateways',
  'workers',
  'Postgres (this database)',
  'Redis',
  'load generator',
  'other',
  'of which interrupts',
  'machine',
  'steal (hypervisor)',
];

function cpuCells(cpu) {
  if (!cpu) return CPU_COLUMNS.map(() => '–');
  const sum = (prefix) =>
    Object.entries(cpu.processes)
      .filter(([name]) => name.startsWith(prefix))
      .reduce((total, [, value]) => total + (value ?? 0), 0);
  const parts = [sum('gateway'), sum('worker'), sum('postgres'), sum('redis'), cpu.bench ?? 0];
  const other = Math.max(0, cpu.machine - parts.reduce((a, b) => a + b, 0));
  const optional = (value) => (typeof value === 'number' ? `${round(value)}%` : '–');
  return [
    ...[...parts, other].map((value) => `${round(value)}%`),
    optional(cpu.irq),
    `${round(cpu.machine)}%`,
    optional(cpu.steal),
  ];
}

const kb = (bytes) => round(bytes / 1000);
const level50Name = (level) => `${level.streams} streams × ${level.ratePerStream} deltas/s`;

/** Results rows of the streaming, model turn, long history and web client scenarios. */
function newScenarioRows(s) {
  const lines = [];
  const blank = ['–', '–', '–', '–', '–'];
  const streaming = s.streaming;
  if (streaming) {
    const levels = [
      ['one stream × 50 deltas/s', streaming.one],
      ...streaming.steps.map((level) => [level50Name(level), level]),
    ];
    for (const [name, level] of levels) {
      lines.push(
        latencyRow(
          'Streaming',
          `delta emitted by an agent → received by a client (${name}, ${level.seconds} s)`,
          level.latency,
          `${level.deliveredPerSecond} deltas/s`,
          '–',
          `of ${level.offeredPerSecond}/s offered; ${level.deltasPerFrame} deltas per frame; lost ${level.lost},` +
            ` errors ${level.errors}; service CPU: gateways ${cpuOf(level.cpu, 'gateway')}%, workers` +
            ` ${cpuOf(level.cpu, 'worker')}%, Redis ${cpuOf(level.cpu, 'redis')}%; load generator ${level.cpu?.bench ?? '?'}%` +
            (level.toRedis
              ? `; emit → a Redis subscriber p50 ${ms(level.toRedis.p50)}, p99 ${ms(level.toRedis.p99)}`
              : ''),
        ),
      );
    }
    if (streaming.idleHop) {
      lines.push(
        latencyRow(
          'Streaming',
          'reference: Redis PUBLISH → subscriber, one every 20 ms (processes idle between)',
          streaming.idleHop,
          '–',
          '–',
          `n=${streaming.idleHop.n}; the building block, back to back: p50 ${ms(s['building-blocks']?.blocks?.redis_hop?.p50)}`,
        ),
      );
    }
    for (const [name, level] of [
      ['one stream × 50 deltas/s', streaming.floor?.one],
      [streaming.floor && level50Name(streaming.floor.concurrent), streaming.floor?.concurrent],
    ]) {
      if (!level) continue;
      lines.push(
        latencyRow(
          'Streaming',
          `floor: the same deltas through the bare parts, PUBLISH → a Socket.IO relay → client (${name}, ${level.seconds} s)`,
          level.latency,
          `${level.deliveredPerSecond} deltas/s`,
          '–',
          `no service: bench/lib/stream-floor.mjs; CPU: relays ${cpuOf(level.cpu, 'gateway')}%, publishers` +
            ` ${cpuOf(level.cpu, 'worker')}%, Redis ${cpuOf(level.cpu, 'redis')}%; load generator ${level.cpu?.bench ?? '?'}%` +
            (level.toRedis
              ? `; publish → a Redis subscriber p50 ${ms(level.toRedis.p50)}, p99 ${ms(level.toRedis.p99)}`
              : ''),
        ),
      );
    }
  }
  const model = s['model-turn'];
  if (model) {
    const m = model.model;
    for (const level of [model.one, model.concurrent]) {
      const name = `${level.conversations} conversation${level.conversations === 1 ? '' : 's'}`;
      const fake = `fake model: first token ${m.ttftMs} ms, ${Math.round(1000 / m.tokenMs)} tokens/s, ${m.tokens} tokens`;
      const b = level.breakdown;
      lines.push(
        latencyRow(
          'Model turn',
          `model's first chunk written → first delta at the client (${name})`,
          level.first,
          '–',
          '–',
          `n=${level.first.n}, errors ${level.errors}; ${fake}` +
            (b
              ? `; first chunk → first delta published (at a Redis subscriber) p50 ${ms(b.firstToRedis.p50)}, p99 ${ms(b.firstToRedis.p99)}`
              : ''),
        ),
        latencyRow(
          'Model turn',
          `model's last chunk written → final message at the client (${name})`,
          level.final,
          '–',
          '–',
          `n=${level.final.n}` +
            (b
              ? `; last chunk → answer stamped in Postgres p50 ${ms(b.lastToStored.p50)}, p99 ${ms(b.lastToStored.p99)};` +
                ` stamped → client p50 ${ms(b.storedToClient.p50)}, p99 ${ms(b.storedToClient.p99)}`
              : ''),
        ),
        latencyRow(
          'Model turn',
          `every token: model → client (${name})`,
          level.deltas,
          '–',
          '–',
          `n=${level.deltas.n}; the workers' CPU per turn ${ms(level.workerCpuMsPerTurn)};` +
            ` service CPU: gateways ${cpuOf(level.cpu, 'gateway')}%, workers ${cpuOf(level.cpu, 'worker')}%`,
        ),
      );
    }
  }
  for (const level of [model?.floor?.one, model?.floor?.concurrent]) {
    if (!level) continue;
    const name = `${level.conversations} conversation${level.conversations === 1 ? '' : 's'}`;
    const cpu =
      `no service: bench/lib/model-floor.mjs; CPU: relays ${cpuOf(level.cpu, 'gateway')}%, readers` +
      ` ${cpuOf(level.cpu, 'worker')}%, Postgres ${cpuOf(level.cpu, 'postgres')}%, Redis ${cpuOf(level.cpu, 'redis')}%`;
    lines.push(
      latencyRow(
        'Model turn',
        `floor: the same turns through the bare parts, first chunk → first delta at the client (${name})`,
        level.first,
        '–',
        '–',
        `n=${level.first.n}; ${cpu}`,
      ),
      latencyRow(
        'Model turn',
        `floor: last chunk → the answer, stored by one INSERT, at the client (${name})`,
        level.final,
        '–',
        '–',
        `n=${level.final.n}${level.missing > 0 ? `; ${level.missing} answers missing` : ''}`,
      ),
    );
  }
  if (model?.sdk) {
    const sdk = model.sdk;
    lines.push(
      latencyRow(
        'Model turn',
        "reference: the openai SDK alone (in the bench process): model's first chunk → first text chunk",
        sdk.first,
        '–',
        '–',
        `n=${sdk.first.n}; CPU per request ${ms(sdk.cpuMsPerRequest)}`,
      ),
      latencyRow(
        'Model turn',
        "reference: the openai SDK alone: model's last chunk → end of the stream",
        sdk.end,
        '–',
        '–',
        `n=${sdk.end.n}; → finish reason p50 ${ms(sdk.finish.p50)}, p99 ${ms(sdk.finish.p99)}`,
      ),
    );
  }
  const history = s['long-history'];
  if (history) {
    lines.push(
      latencyRow(
        'Long history',
        `connect to a stopped conversation of ${history.events} events → awaiting_user_input`,
        history.latency,
        '–',
        '–',
        `n=${history.latency.n}, errors ${history.errors}; stored loading → awaiting_user_input p50 ${ms(history.stored.p50)}, p99 ${ms(history.stored.p99)}`,
      ),
      row([
        'Long history',
        `worker RSS per hosted idle conversation of ${history.events} events (${history.hosted} conversations)`,
        ...blank,
        `${history.perConversationKiB} KiB per conversation (after a forced GC, RSS of the workers ${history.rssBeforeMiB} →` +
          ` ${history.rssAfterMiB} MiB; V8 heap used ${history.heapBeforeMiB} → ${history.heapAfterMiB} MiB,` +
          ` ${history.heapPerConversationKiB} KiB per conversation); histories written in ${history.seedS} s`,
      ]),
    );
  }
  const webhooks = s.webhooks;
  if (webhooks) {
    for (const level of webhooks.levels) {
      lines.push(
        latencyRow(
          'Webhooks',
          `answer stored → turn.completed at the receiver, ${level.offeredRate} turns/s offered over ${level.conversations} conversations`,
          level.lag,
          `${level.throughput.value} turn.completed/s`,
          '–',
          `errors ${level.errors}; pending ${level.pendingAfter} 3 s after the level`,
        ),
      );
    }
  }
  const sizes = s.sizes;
  if (sizes) {
    lines.push(
      row([
        'Web client',
        'client SDK (libs/client/dist + socket.io-client), minified, gzipped',
        ...blank,
        `${sizes.sdkGzippedBytes} bytes gzipped (${sizes.sdkMinifiedBytes} bytes minified)`,
      ]),
      row([
        'Web client',
        "web app's initial JavaScript, gzipped",
        ...blank,
        `${sizes.appGzippedBytes} bytes (${(sizes.appFiles ?? []).join(', ')})`,
      ]),
    );
  }
  const web = s.browser;
  if (web) {
    lines.push(
      latencyRow(
        'Web client',
        `headless Chromium: open a ${web.events}-event conversation → its latest events on screen`,
        web.open,
        '–',
        '–',
        `n=${web.open.n}; viewport ${web.viewport}`,
      ),
      latencyRow(
        'Web client',
        'headless Chromium: streamed delta reaching the page (WebSocket frame) → painted',
        web.paint,
        '–',
        '–',
        `n=${web.paint.n} (${web.deltasArrived} deltas arrived)`,
      ),
    );
    if (web.hostile) {
      lines.push(
        row([
          'Web client',
          `headless Chromium: worst of ${web.hostile.messages} hostile messages (262,144 and 16,384 characters) reaching the page → painted`,
          ...blank,
          `${ms(web.hostile.worst.painted)} (${web.hostile.worst.chars} characters of ${web.hostile.worst.name}); worst render ${ms(web.hostile.worstRender.render)} (${web.hostile.worstRender.chars} characters of ${web.hostile.worstRender.name})`,
        ]),
      );
      const expanded = web.hostile.worstExpanded;
      if (expanded) {
        lines.push(
          row([
            'Web client',
            `headless Chromium: worst of ${expanded.collapsed} hostile messages shown collapsed, its button "Show the whole message" pressed → painted whole (for information)`,
            ...blank,
            `${ms(expanded.expanded)} (${expanded.chars} characters of ${expanded.name})`,
          ]),
        );
      }
    }
  }
  return lines;
}

function cpuOf(cpu, prefix) {
  if (!cpu) return '?';
  return round(
    Object.entries(cpu.processes)
      .filter(([name]) => name.startsWith(prefix))
      .reduce((total, [, value]) => total + (value ?? 0), 0),
  );
}

/**
 * The figures the service is held to (issue "Benchmark and chaos harness"),
 * each against what this run measured.
 */
function targetsTable(s, blocks) {
  const rows = [];
  const add = (figure, target, measured, met) =>
    rows.push(row([figure, target, measured, met === null ? '–' : met ? 'yes' : '**no**']));
  const rt = s['round-trip'];
  const budget = blocks ? roundTripBudget(blocks, 'p50') : null;
  if (rt && budget) {
    const times = rt.latency.p50 / budget;
    add(
      'round trip p50',
      '≤ 3 × the building blocks on its path',
      `${ms(rt.latency.p50)} = ${round(times)} × ${ms(round(budget))}`,
      times <= 3,
    );
  }
  if (rt) add('round trip p99', '≤ 15 ms', ms(rt.latency.p99), rt.latency.p99 <= 15);
  // The level that meets the figure with the most messages/s; else the lowest p99.
  const meets = (l) => l.throughput.value >= 1000 && l.latency.p99 <= 100;
  const paced = (s.sustained?.levels ?? []).filter((l) => l.offeredRate >= 1000);
  const best =
    paced.filter(meets).sort((a, b) => b.throughput.value - a.throughput.value)[0] ??
    paced.sort((a, b) => a.latency.p99 - b.latency.p99)[0];
  if (best) {
    add(
      'sustained load',
      '≥ 1,000 user messages/s with p99 ≤ 100 ms',
      `${best.throughput.value} msg/s (${levelName(best)}), p99 ${ms(best.latency.p99)}`,
      meets(best),
    );
  }
  const waited = s['rest-wait'];
  if (waited) {
    add(
      'waited REST round trip p50 (Prefer: wait)',
      '≤ 2 × the plain round trip',
      `${ms(waited.waited.p50)} = ${waited.ratio} × ${ms(waited.plain.p50)}`,
      waited.ratio <= 2,
    );
  }
  const cold = s['cold-start'];
  if (cold) add('cold start p50', '≤ 20 ms', ms(cold.latency.p50), cold.latency.p50 <= 20);
  const replay = s.replay;
  if (replay) {
    add(
      `reconnect replay of ${replay.events} events`,
      '≤ 300 ms',
      `p50 ${ms(replay.latency.p50)}, max ${ms(replay.latency.max)}`,
      replay.latency.max <= 300,
    );
  }
  const failover = s.failover;
  if (failover) {
    add(
      'failover after kill -9, every conversation',
      '≤ LEASE_TTL_MS + 2 s',
      `max ${ms(failover.latency.max)} (${failover.withinBound}/${failover.conversations} within)`,
      failover.withinBound === failover.conversations,
    );
  }
  const handoff = s.handoff;
  if (handoff) {
    add(
      'hand-off on SIGTERM (message sent → answer), every conversation',
      '≤ 1 s',
      `max ${ms(handoff.afterSend.max)}`,
      handoff.afterSend.max <= 1000,
    );
  }
  const cut = s.stop;
  if (cut) {
    for (const [name, what] of Object.entries(TURN_CUTS)) {
      const latency = cut[name].latency;
      add(
        `turn cut by ${what} (sent → interrupted answer at the client), every turn`,
        `≤ ${cut.bound / 1000} s`,
        `max ${ms(latency.max)} of ${latency.n} (p50 ${ms(latency.p50)})`,
        latency.n > 0 && cut[name].errors === 0 && latency.max <= cut.bound,
      );
    }
  }
  const memory = s.memory;
  if (memory) {
    add(
      `gateway memory per idle socket (${memory.gateway.sockets})`,
      '≤ 30 KB',
      `${memory.gateway.perSocketKiB} KiB`,
      memory.gateway.perSocketKiB * 1.024 <= 30,
    );
    add(
      `worker memory per idle conversation (${memory.worker.conversations})`,
      '≤ 50 KB',
      `${memory.worker.perConversationKiB} KiB`,
      memory.worker.perConversationKiB * 1.024 <= 50,
    );
  }
  const streaming = s.streaming;
  if (streaming) {
    for (const [name, level, floor] of [
      ['one stream', streaming.one, streaming.floor?.one],
      [`${level50Name(streaming.concurrent)}`, streaming.concurrent, streaming.floor?.concurrent],
    ]) {
      if (!level) continue;
      const delivered = level.deliveredPerSecond >= 0.99 * level.offeredPerSecond;
      const note = level.streams > 1 ? ` (${level.deliveredPerSecond} deltas/s delivered)` : '';
      const floorOf = (key) =>
        floor ? `; the bare parts' floor here: ${ms(floor.latency[key])}` : '';
      add(
        `streamed delta, agent → client, p50 (${name})`,
        '≤ 1 ms',
        `${ms(level.latency.p50)}${note}${floorOf('p50')}`,
        level.latency.p50 <= 1 && delivered,
      );
      add(
        `streamed delta, agent → client, p99 (${name})`,
        '≤ 10 ms',
        `${ms(level.latency.p99)}${floorOf('p99')}`,
        level.latency.p99 <= 10 && delivered,
      );
    }
    const best = streaming.best;
    add(
      `most deltas/s delivered with p99 ≤ ${STREAM_STEP_P99_MS} ms`,
      'measured (no target)',
      best
        ? `${best.deliveredPerSecond} deltas/s (${best.streams} streams × ${best.ratePerStream}/s), p99 ${ms(best.latency.p99)}`
        : `none: ${streaming.steps.map((l) => `${l.offeredPerSecond}/s p99 ${ms(l.latency.p99)}`).join(', ')}`,
      null,
    );
  }
  const history = s['long-history'];
  if (history) {
    add(
      `worker memory per hosted conversation of ${history.events} events (${history.hosted})`,
      '≤ 100 KB',
      `${history.perConversationKiB} KiB (V8 heap ${history.heapPerConversationKiB} KiB)`,
      history.hosted === history.conversations && history.perConversationKiB * 1.024 <= 100,
    );
    add(
      `restore of a ${history.events}-event conversation → awaiting_user_input, p50`,
      '≤ 30 ms',
      `${ms(history.latency.p50)} (connect → ready at the client; stored loading → ready ${ms(history.stored.p50)})`,
      history.latency.p50 <= 30,
    );
  }
  const hooks = s.webhooks;
  const hooked = hooks?.levels.find((level) => level.offeredRate === 500);
  if (hooked) {
    add(
      `webhook delivery lag at 500 turns/s over ${hooked.conversations} conversations, p50 / p99`,
      '≤ 20 ms / ≤ 200 ms',
      `${ms(hooked.lag.p50)} / ${ms(hooked.lag.p99)} (${hooked.throughput.value} turn.completed/s received)`,
      hooked.lag.p50 <= 20 && hooked.lag.p99 <= 200 && hooked.throughput.value >= 450,
    );
  }
  const outbox = hooks?.outboxCost;
  if (outbox && outbox.addedPercent !== null) {
    add(
      `the outbox's CPU per turn with webhooks on, at ${outbox.offeredRate} turns/s over ${outbox.conversations} conversations (gateways, workers, Postgres, Redis)`,
      '≤ 10 % more than off',
      `${outbox.onMsPerTurn} ms vs ${outbox.offMsPerTurn} ms a turn (${outbox.addedPercent > 0 ? '+' : ''}${outbox.addedPercent} %${outbox.pairs ? `; medians of ${outbox.pairs} alternating pairs` : ''})`,
      outbox.addedPercent <= 10 && outbox.errors === 0,
    );
  }
  const model = s['model-turn'];
  if (model) {
    for (const [level, floor] of [
      [model.one, model.floor?.one],
      [model.concurrent, model.floor?.concurrent],
    ]) {
      if (!level) continue;
      const name = `${level.conversations} conversation${level.conversations === 1 ? '' : 's'}`;
      const floorOf = (summary) => (summary ? `; the bare parts' floor here: ${ms(summary)}` : '');
      add(
        `model turn, first token added, p50 (${name})`,
        '≤ 3 ms',
        `${ms(level.first.p50)}${floorOf(floor?.first.p50)}`,
        level.first.p50 <= 3 && level.errors === 0,
      );
      add(
        `model turn, first token added, p99 (${name})`,
        '≤ 20 ms',
        `${ms(level.first.p99)}${floorOf(floor?.first.p99)}`,
        level.first.p99 <= 20 && level.errors === 0,
      );
      add(
        `model turn, final message added, p50 (${name})`,
        '≤ 5 ms',
        `${ms(level.final.p50)}${floorOf(floor?.final.p50)}`,
        level.final.p50 <= 5 && level.errors === 0,
      );
    }
  }
  const sizes = s.sizes;
  if (sizes) {
    add(
      'client SDK, minified and gzipped (socket.io-client included)',
      '≤ 30 KB',
      `${sizes.sdkGzippedBytes} bytes (${kb(sizes.sdkGzippedBytes)} KB)`,
      sizes.sdkGzippedBytes <= 30_000,
    );
    add(
      "web app's initial JavaScript, gzipped",
      '≤ 120 KB',
      `${sizes.appGzippedBytes} bytes (${kb(sizes.appGzippedBytes)} KB)`,
      sizes.appGzippedBytes <= 120_000,
    );
  }
  const web = s.browser;
  if (web) {
    add(
      `web app opens a ${web.events}-event conversation to its latest events (headless Chromium)`,
      '≤ 1 s',
      `max ${ms(web.open.max)} of ${web.open.n} (p50 ${ms(web.open.p50)})`,
      web.open.max <= 1000,
    );
    add(
      'web app, streamed delta reaching the page → painted, p99',
      '≤ 50 ms',
      `${ms(web.paint.p99)} (p50 ${ms(web.paint.p50)}, n=${web.paint.n})`,
      web.paint.p99 <= 50,
    );
    if (web.hostile) {
      add(
        'web app, worst message of 262,144 characters of any content (or 16,384, parsed as Markdown), reaching the page → painted',
        '≤ 50 ms',
        `${ms(web.hostile.worst.painted)} (${web.hostile.worst.chars} characters of ${web.hostile.worst.name}; render ${ms(web.hostile.worstRender.render)} at worst)`,
        web.hostile.worst.painted <= 50,
      );
    }
  }
  const rc = s['redis-cluster'];
  if (rc) {
    const on = 'on a 3-master Redis Cluster with 8 queues:';
    if (rc.roundTripRatio !== null) {
      add(
        `${on} round trip p50`,
        '≤ 1.3 × one Redis in the same run',
        `${ms(rc.roundTrip.latency.p50)} = ${rc.roundTripRatio} × ${ms(s['round-trip']?.latency.p50)}`,
        rc.roundTripRatio <= 1.3,
      );
    }
    const levels = (rc.sustained?.levels ?? []).filter((l) => l.offeredRate !== null);
    const top =
      levels.filter(meets).sort((a, b) => b.throughput.value - a.throughput.value)[0] ??
      levels.sort((a, b) => b.throughput.value - a.throughput.value)[0];
    if (top) {
      add(
        `${on} sustained load`,
        '≥ 1,000 user messages/s with p99 ≤ 100 ms',
        `${top.throughput.value} msg/s (${levelName(top)}), p99 ${ms(top.latency.p99)}`,
        meets(top),
      );
    }
    if (rc.failover) {
      add(
        `${on} failover after kill -9 of a worker, every conversation`,
        '≤ LEASE_TTL_MS + 2 s',
        `max ${ms(rc.failover.latency.max)} (${rc.failover.withinBound}/${rc.failover.conversations} within)`,
        rc.failover.withinBound === rc.failover.conversations,
      );
    }
    const kill = rc.masterKill;
    if (kill) {
      add(
        `${on} kill -9 of a Redis master under load`,
        'every acknowledged message answered; first answer ≤ cluster-node-timeout + 3 s',
        `${kill.unanswered} of ${kill.acknowledged} unanswered; first answer of the ${kill.affected}` +
          ` conversations on it: max ${ms(kill.firstAnswerAffected.max)} (bound ${ms(kill.boundMs)})`,
        kill.unanswered === 0 && kill.withinBound === kill.affected,
      );
    }
  }
  for (const t of lifecycleTargets(s)) add(t.figure, t.target, t.measured, t.met);
  if (rows.length === 0) return [];
  return [
    '## Figures to reach',
    '',
    row(['Figure', 'Target', 'Measured', 'Met']),
    row(['---', '---', '---', '---']),
    ...rows,
    '',
  ];
}

const CAPACITY_ROLES = ['gateway', 'worker', 'postgres', 'redis'];

/** The capacity scenario's costs per unit of work, one Redis beside the Redis Cluster. */
function capacitySection(capacity) {
  if (!capacity?.redis || !capacity?.redisCluster) return [];
  const both = [capacity.redis, capacity.redisCluster];
  const roles = (costs) =>
    costs ? CAPACITY_ROLES.map((r) => `${r} ${costs[r] ?? '–'}`).join(', ') : '–';
  const lines = [
    '## Capacity (per unit of work)',
    '',
    'From the `capacity` scenario (`npm run bench -- --only capacity`); CPU in ms of one core' +
      ' per unit, Redis commands of the masters (INFO commandstats), Postgres transactions' +
      ' (pg_stat_database). [docs/capacity.md](docs/capacity.md) turns them into nodes.',
    '',
    row(['Measure', 'one Redis', 'Redis Cluster (3 masters, 8 queues)']),
    row(['---', '---', '---']),
  ];
  const levels = Math.max(...both.map((b) => b.messages.levels.length));
  for (let i = 0; i < levels; i += 1) {
    const cells = both.map((b) => {
      const l = b.messages.levels[i];
      return l
        ? `${l.answeredPerSecond} msg/s answered (of ${l.offeredRate}): ${roles(l.cpuMsPerMessage)};` +
            ` ${l.redisCommandsPerMessage.total} Redis commands, ${l.pgTransactionsPerMessage}` +
            ` Postgres transactions; p99 ${ms(l.latency.p99)}`
        : '–';
    });
    lines.push(row([`per message with its answer, level ${i + 1}`, ...cells]));
  }
  lines.push(
    row([
      'per streamed delta',
      ...both.map(
        (b) =>
          `${b.streaming.deltasPerSecond} deltas/s over ${b.streaming.streams} streams: ` +
          `${roles(b.streaming.cpuMsPerDelta)}; ${b.streaming.redisCommandsPerDelta.total} Redis commands`,
      ),
    ]),
  );
  lines.push(
    row([
      'memory per idle socket (a gateway)',
      ...both.map((b) => `${b.memory.gateway.perSocketKiB} KiB (${b.memory.gateway.sockets})`),
    ]),
  );
  lines.push(
    row([
      'memory per hosted idle conversation (the workers)',
      ...both.map(
        (b) => `${b.memory.worker.perConversationKiB} KiB (${b.memory.worker.conversations})`,
      ),
    ]),
  );
  lines.push(
    row([
      'hosted idle conversations: CPU % of a core (workers + Postgres) per 1,000',
      ...both.map((b) => `${b.memory.worker.idleCpuPerThousand ?? '–'}`),
    ]),
  );
  lines.push('');
  return lines;
}

export function renderMarkdown(data, chart) {
  const s = data.scenarios;
  const m = data.machine;
  const blocks = s['building-blocks']?.blocks ?? null;
  const lines = [];
  lines.push('# Benchmarks', '');
  const runDates = [
    ...new Set(
      Object.values(s)
        .map((scenario) => scenario.run?.slice(0, 10))
        .filter(Boolean),
    ),
  ].sort();
  // The processors the shown scenarios ran on, with their dates, when not all one.
  const cpuDates = new Map();
  for (const scenario of Object.values(s)) {
    const cpu = data.runs?.find((r) => r.startedAt === scenario.run)?.machine?.cpu ?? m.cpu;
    const dates = cpuDates.get(cpu) ?? new Set();
    if (scenario.run) dates.add(scenario.run.slice(0, 10));
    cpuDates.set(cpu, dates);
  }
  const where =
    cpuDates.size > 1
      ? `on machines of one kind (${[...cpuDates]
          .map(([cpu, dates]) => `${cpu}: ${[...dates].sort().join(', ')}`)
          .join('; ')}); the latest:`
      : 'on one machine:';
  lines.push(
    `Measured on ${runDates.length > 1 ? runDates.join(', ') : data.date} by \`npm run bench\` (bench/run.mjs) ${where} ${m.cores} × ${m.cpu},` +
      ` ${m.memoryGiB} GiB RAM, Linux ${m.kernel}, Node ${m.node}, Postgres ${m.postgres ?? '?'},` +
      ` Redis ${m.redis ?? '?'}. Everything shares the ${m.cores} cores: Postgres, Redis, the gateways,` +
      ' the workers and the load generator itself. Raw numbers: ' +
      `[bench/results/${data.date}.json](bench/results/${data.date}.json).`,
    '',
  );
  const clusters = [...new Set(Object.values(s).map((r) => JSON.stringify(r.cluster)))].map((c) =>
    JSON.parse(c),
  );
  for (const c of clusters) {
    lines.push(
      `Cluster: ${c.gateways} gateway(s), ${c.workers} worker(s), \`LEASE_TTL_MS=${c.leaseTtlMs}\`,` +
        ` \`WORKER_CONCURRENCY=${c.workerConcurrency}\`, \`MAX_CONCURRENT_CONVERSATIONS=10000\`,` +
        ' `RATE_LIMIT_PER_MINUTE=0`, a fresh database and Redis key prefix per run; the echo agent,' +
        " the bench's agent module (`AGENT_MODULES=bench/agents/bench-agents.mjs`: `bench_pacer`" +
        ' streams deltas at a given pace) and the `llm` agent on a local fake OpenAI-compatible' +
        ' server (bench/lib/fake-model.mjs).',
    );
  }
  lines.push('');
  // Only the runs whose results are shown (the newest run of each scenario).
  const shownRuns = (data.runs ?? []).filter((r) =>
    Object.values(s).some((scenario) => scenario.run === r.startedAt),
  );
  const commits = [
    ...new Set(
      shownRuns
        .filter((r) => r.source)
        .map((r) => `${r.source.commit}${r.source.localChanges ? ' (with local changes)' : ''}`),
    ),
  ];
  if (commits.length > 0) lines.push(`Service built from commit ${commits.join(', ')}.`, '');
  const loads = shownRuns.map((r) => r.loadAtStart).filter((l) => typeof l === 'number');
  if (loads.length > 0) {
    lines.push(
      `The machine's 1-minute load average was ${loads.join(', ')} when the run(s) started` +
        ` (work outside the benchmark competes for the same ${m.cores} cores and makes the` +
        ' numbers noisier); the CPU table below shows who used the cores.',
      '',
    );
  }
  lines.push(...targetsTable(s, blocks));
  lines.push(...capacitySection(s.capacity));
  lines.push('## Results', '');
  lines.push(
    row(['Scenario', 'Measure', 'p50', 'p95', 'p99', 'Throughput', 'vs building blocks', 'Notes']),
  );
  lines.push(row(['---', '---', '---:', '---:', '---:', '---:', '---:', '---']));
  if (blocks) {
    for (const block of Object.values(blocks)) {
      lines.push(latencyRow('Building block', block.label, block, '–', '–', `n=${block.n}`));
    }
  }
  const budget50 = blocks ? roundTripBudget(blocks, 'p50') : null;
  const budget99 = blocks ? roundTripBudget(blocks, 'p99') : null;
  const built50 = blocks ? builtPathBudget(blocks, 'p50') : null;
  const built99 = blocks ? builtPathBudget(blocks, 'p99') : null;
  if (blocks) {
    lines.push(
      latencyRow(
        'Building blocks',
        'sum on the round trip path: ack + 2 × INSERT + 2 × Redis hop',
        {
          p50: round(budget50),
          p95: round(roundTripBudget(blocks, 'p95')),
          p99: round(budget99),
        },
      ),
    );
    lines.push(
      latencyRow(
        'Building blocks',
        'sum on the path as built: ack + 2 × append-shaped statement + 2 × Redis hop',
        {
          p50: round(built50),
          p95: round(builtPathBudget(blocks, 'p95')),
          p99: round(built99),
        },
      ),
    );
  }
  const rt = s['round-trip'];
  if (rt) {
    lines.push(
      latencyRow(
        'Round trip',
        'message → echo answer (one conversation, sequential)',
        rt.latency,
        `${rt.throughput.value} msg/s`,
        `p50 ${ratio(rt.latency.p50, budget50)}, p99 ${ratio(rt.latency.p99, budget99)}` +
          ` (path as built: p50 ${ratio(rt.latency.p50, built50)}, p99 ${ratio(rt.latency.p99, built99)})`,
        `n=${rt.latency.n}, errors ${rt.errors}; ${rt.appends?.user?.perMessage ?? '?'} + ${rt.appends?.agent?.perMessage ?? '?'} appends per answer`,
      ),
    );
    lines.push(latencyRow('Round trip', 'message → ack (stored)', rt.ack, '–', '–', ''));
  }
  const waited = s['rest-wait'];
  if (waited) {
    lines.push(
      latencyRow(
        'Waited REST round trip',
        'POST …/events with Prefer: wait → the turn in the response (echo)',
        waited.waited,
        '–',
        `p50 ${waited.ratio} × the plain socket round trip (p50 ${ms(waited.plain.p50)}), measured alternately`,
        `n=${waited.waited.n}, errors ${waited.errors}`,
      ),
    );
  }
  const cold = s['cold-start'];
  if (cold) {
    lines.push(
      latencyRow(
        'Cold start',
        'connect to a stopped conversation → awaiting_user_input',
        cold.latency,
        '–',
        blocks
          ? `p50 ${ratio(cold.latency.p50, blocks.bullmq_pickup?.p50)} of a BullMQ pickup`
          : '–',
        `n=${cold.latency.n}, errors ${cold.errors}; handshake alone p50 ${ms(cold.connect.p50)}`,
      ),
    );
  }
  const starts = s['process-start'];
  if (starts) {
    for (const role of ['gateway', 'worker']) {
      const start = starts[role];
      if (!start) continue;
      lines.push(
        latencyRow(
          'Process start',
          `a ${role} added to the cluster: spawn → ready`,
          start.wall,
          '–',
          '–',
          `n=${start.wall.n}; CPU to ready p50 ${ms(start.cpu.p50)}`,
        ),
      );
    }
  }
  const replay = s.replay;
  if (replay) {
    lines.push(
      latencyRow(
        'Reconnect replay',
        `connect with latest_event_id=-1 → last of ${replay.events} events`,
        replay.latency,
        `${replay.throughput.value} events/s`,
        '–',
        `n=${replay.latency.n}; first event p50 ${ms(replay.first.p50)}; out of order ${replay.outOfOrder}`,
      ),
    );
  }
  const cut = s.stop;
  if (cut) {
    for (const [name, what] of Object.entries(TURN_CUTS)) {
      lines.push(
        latencyRow(
          'Turn cut',
          `${what} sent → the turn's interrupted answer at the client`,
          cut[name].latency,
          '–',
          '–',
          `n=${cut[name].latency.n}, errors ${cut[name].errors}; one conversation, a 20 deltas/s turn cut after 3 deltas`,
        ),
      );
    }
  }
  for (const name of ['failover', 'handoff']) {
    const f = s[name];
    if (!f) continue;
    const kill = f.signal === 'SIGKILL';
    lines.push(
      latencyRow(
        kill ? 'Failover (kill -9)' : 'Hand-off (SIGTERM)',
        kill
          ? `kill → answer stored, per conversation (${f.conversations} without clients)`
          : `message sent after SIGTERM → answer stored (${f.conversations} without clients)`,
        kill ? f.latency : f.afterSend,
        '–',
        `max ${ms(kill ? f.latency.max : f.afterSend.max)} vs bound ${ms(f.boundMs)}`,
        `${f.withinBound}/${f.conversations} within the bound, ${f.unanswered} unanswered;` +
          ` new holder's first write p50 ${ms(f.takeover?.p50)} after the signal, then the answer` +
          ` p50 ${ms(f.restoreAndAnswer?.p50)} later; REST send p50 ${ms(f.send?.p50)};` +
          ` ${f.heldByVictim} conversations on the stopped worker, which exited after ${ms(f.workerExitMs)}`,
      ),
    );
  }
  const sustained = s.sustained;
  if (sustained) {
    for (const level of sustained.levels) {
      lines.push(
        latencyRow(
          'Sustained load',
          `${levelName(level)} (${
            level.offeredRate
              ? 'each at its share of the rate, latency from when due'
              : 'send, wait for the echo, repeat'
          }; ${sustained.durationS} s)`,
          level.latency,
          `${level.throughput.value} msg/s`,
          '–',
          `errors ${level.errors}; load generator CPU ${level.cpu?.bench ?? '?'}% of a core`,
        ),
      );
    }
  }
  const memory = s.memory;
  if (memory) {
    const g = memory.gateway;
    const w = memory.worker;
    const blank = ['–', '–', '–', '–', '–'];
    lines.push(
      row([
        'Memory',
        `gateway RSS per idle socket (${g.sockets} sockets)`,
        ...blank,
        `${g.perSocketKiB} KiB per socket (RSS ${g.rssBeforeMiB} → ${g.rssAfterMiB} MiB);` +
          ` the client side used ${g.clientPerSocketKiB} KiB per socket`,
      ]),
    );
    lines.push(
      row([
        'Memory',
        `worker RSS per idle hosted conversation (${w.conversations} conversations)`,
        ...blank,
        `${w.perConversationKiB} KiB per conversation (RSS of the workers ${w.rssBeforeMiB} →` +
          ` ${w.rssAfterMiB} MiB); idle, they cost ${w.idleCpuPerThousand}% of a core per 1,000` +
          ` (workers ${w.idleCpuBefore.workers}% → ${w.idleCpu.workers}%, Postgres` +
          ` ${w.idleCpuBefore.postgres}% → ${w.idleCpu.postgres}%, Postgres transactions/s` +
          ` ${w.idleTransactionsPerSecondBefore} → ${w.idleTransactionsPerSecond})`,
      ]),
    );
  }
  lines.push(...newScenarioRows(s));
  for (const cells of lifecycleResults(s)) lines.push(row(cells));
  lines.push('');
  if (chart) lines.push(`![Latency percentiles against load](${chart})`, '');

  const breakdowns = [];
  if (rt?.breakdown) breakdowns.push(['round trip', rt]);
  for (const level of sustained?.levels ?? []) {
    if (level.breakdown) breakdowns.push([levelName(level), level]);
  }
  if (breakdowns.length > 0) {
    lines.push("### Where a round trip's time goes", '');
    lines.push(
      "From the timestamps the service stores with each event (taken inside the append's" +
        " transaction, same clock as the client), the services' own metrics (`/metrics`) and" +
        ' samples of `pg_stat_activity`. Cells are p50 / p99 unless said otherwise.',
      '',
    );
    lines.push(row(['Segment', ...breakdowns.map(([name]) => name)]));
    lines.push(row(['---', ...breakdowns.map(() => '---:')]));
    const first = breakdowns[0][1].breakdown;
    for (const key of Object.keys(first)) {
      lines.push(
        row([
          first[key].label,
          ...breakdowns.map(([, r]) => {
            const part = r.breakdown[key];
            return part ? `${ms(part.p50)} / ${ms(part.p99)}` : '–';
          }),
        ]),
      );
    }
    for (const writer of ['user', 'agent']) {
      lines.push(
        row([
          `appends by ${writer === 'user' ? 'the gateway (user events)' : 'the worker (agent events)'}` +
            ' per answer × their mean time inside the service',
          ...breakdowns.map(([, r]) => {
            const a = r.appends?.[writer];
            return a ? `${a.perMessage} × ${ms(a.meanMs)}` : '–';
          }),
        ]),
      );
    }
    const worst = (eventLoop, prefix, key) => {
      const values = Object.entries(eventLoop ?? {})
        .filter(([name]) => name.startsWith(prefix))
        .map(([, lag]) => lag[key]);
      return values.length ? ms(Math.max(...values)) : '–';
    };
    for (const prefix of ['gateway', 'worker']) {
      lines.push(
        row([
          `event-loop delay of the ${prefix}s, mean / p99 (worst process; includes prom-client's 10 ms sampling interval)`,
          ...breakdowns.map(
            ([, r]) =>
              `${worst(r.eventLoop, prefix, 'meanMs')} / ${worst(r.eventLoop, prefix, 'p99Ms')}`,
          ),
        ]),
      );
    }
    for (const role of ['gateways', 'workers']) {
      lines.push(
        row([
          `Postgres connections of the ${role} (average): active / idle in transaction / idle`,
          ...breakdowns.map(([, r]) => {
            const a = activitySummary(r.postgres, role);
            return a ? `${a.active} / ${a.idleInTransaction} / ${a.idle}` : '–';
          }),
        ]),
      );
    }
    lines.push('');
  }

  const withCpu = Object.entries(s).filter(([, r]) => r.cpu);
  if (withCpu.length > 0) {
    lines.push('### CPU during the measurements', '');
    lines.push(
      `Share of one core (100% = one core busy; the machine has ${m.cores} cores, so at most` +
        ` ${100 * m.cores}%), from /proc. Postgres counts this run's backends only; Redis is the` +
        ' whole (shared) server; "other" is everything else on the machine, including other' +
        " users' work and Postgres' shared background processes.",
      '',
    );
    lines.push(row(['Scenario', ...CPU_COLUMNS, 'load average', 'largest "other"']));
    lines.push(row(['---', ...CPU_COLUMNS.map(() => '---:'), '---:', '---']));
    const load = (cpu) => [
      cpu?.loadAverage?.join(' → ') ?? '–',
      cpu?.otherTop?.map((o) => `${o.label} ${round(o.percent)}%`).join(', ') || '–',
    ];
    for (const [name, r] of withCpu) {
      if (name !== 'sustained') lines.push(row([name, ...cpuCells(r.cpu), ...load(r.cpu)]));
    }
    for (const level of sustained?.levels ?? []) {
      if (level.cpu) {
        lines.push(
          row([`sustained, ${levelName(level)}`, ...cpuCells(level.cpu), ...load(level.cpu)]),
        );
      }
    }
    lines.push('');
  }

  const failed = Object.entries(data.failures ?? {});
  if (failed.length > 0) {
    lines.push('### Scenarios that did not complete', '');
    for (const [name, f] of failed) lines.push(`- ${name}: ${f.message}`);
    lines.push('');
  }

  lines.push('## How to run', '');
  lines.push(
    'Needs Postgres (trust authentication) and Redis on loopback (`DATABASE_URL`, `REDIS_URL`;' +
      ' defaults `postgres://postgres@127.0.0.1:5432/postgres` and `redis://127.0.0.1:6379`).' +
      ' The harness builds `dist/` if needed, creates a database `bench_<stamp>` and a key prefix' +
      ' `bench-<stamp>`, starts the cluster, runs the scenarios and removes everything again' +
      ' (`--keep` keeps the database and keys). The default run takes about 9 minutes; memory is' +
      ' measured near the end, on a fresh gateway and fresh workers, and the long histories last,' +
      ' on fresh workers again. The round trip is timed after 2,000' +
      ' unmeasured round trips (V8 compiles the hot path meanwhile). Sustained load runs closed-loop levels first (1, 10, 100, 1,000' +
      ' clients, each sending again as soon as its echo arrives: the most the cluster answers),' +
      ' then paced levels: the 1,000 conversations each sending at its share of an offered rate' +
      ' (250 to 1,250 msg/s), latency counted from when each message was due; throughput counts' +
      ' the answers that arrived within the measured window, so a level paced at exactly' +
      ' 1,000 msg/s reads a little above or below it.',
    '',
    '```sh',
    'npm run bench                                   # every scenario, 2 gateways + 2 workers',
    'npm run bench -- --quick                        # short run; results in bench/results/<date>-quick.json',
    "npm run bench -- --only round-trip,cold-start   # some scenarios (merged into the day's results)",
    'npm run bench -- --only memory                  # RSS per idle socket and per hosted conversation',
    'npm run bench -- --only streaming,model-turn    # deltas agent → client; the overhead on a model turn',
    'npm run bench -- --only long-history,sizes,browser',
    'npm run bench -- --sustained-conversations 1000 --duration 20 --gateways 2 --workers 2',
    'npm run bench -- --only sustained --profile     # V8 CPU profiles of the services, summarized',
    'npm run bench -- --render                       # BENCHMARKS.md again from the newest results',
    'npm run bench -- --help',
    '```',
    '',
    'The round trip\'s "vs building blocks" ratio divides its percentile by the sum of the same' +
      ' percentile of the building blocks on its path (Socket.IO ack, two durable Postgres' +
      ' INSERTs, a Redis PUBLISH → subscriber hop for the wake-up and one for the answer, which' +
      " travels on the conversation's own channel; one gateway's Socket.IO adapter to another's is" +
      ' measured for reference),' +
      ' all measured in the same run; the second ratio uses the path as the service builds it' +
      ' (two append statements per answer: the user event; `running`, the answer and' +
      ' `awaiting_user_input` together). Sums of percentiles overestimate the percentile of a sum' +
      ' at p95/p99.' +
      " Failover and hand-off times come from the stored answer's" +
      ' timestamp in Postgres; no client is connected to those conversations.',
    '',
    'Streaming, model turn and browser timings cross processes on one clock: the emitter (the' +
      " `bench_pacer` agent in a worker, the fake model server) writes into each delta's text the" +
      ' time it sent it, `process.hrtime.bigint()` (CLOCK_MONOTONIC, the same in every process of' +
      ' the machine), and the client reads the same clock when the delta arrives. The runtime' +
      ' batches deltas that come within 8 ms of the previous publish, so one received delta may' +
      ' hold several emit times: each is a sample. Streaming runs one stream, then 200 concurrent' +
      ' streams at 50 deltas/s each, then steps the pace of every stream: below it (5, 10, 25' +
      ' deltas/s) and, when 50 deltas/s is within 50 ms at p99, above it (100, 200, 400,' +
      ' 800 deltas/s) until p99 passes 50 ms; turns are 250 deltas (a few hundred tokens) one' +
      " after the other, and the streams are out of phase: each starts within one delta's" +
      ' interval and its first turn is of a random length, so that turns end at their own' +
      ' moments; the first second of each level is not counted. At 200 streams × 50 deltas/s a' +
      ' subscriber of the bench on 10 of the rooms in Redis tells the first half of the path' +
      ' (emit → Redis) from the second. The floor runs the one' +
      ' stream and the 200 streams again, with the service idle, through the bare parts alone' +
      ' (bench/lib/stream-floor.mjs): two publisher processes PUBLISH each delta with an' +
      ' auto-pipelined ioredis connection, as the workers do, and two relays subscribed to the' +
      " streams' channels emit each one on its client's Socket.IO socket, as the gateways do;" +
      ' the service adds the difference. The model turn uses the' +
      ' `llm` agent against a fake model in a process of its own (first token after 100 ms, then' +
      ' 50 tokens/s, 50 tokens an answer; each conversation asks again as soon as it has its' +
      ' answer, and the conversations are out of phase as independent users are: each starts' +
      " at a random moment within one turn's length, and again after the warm-up): the first" +
      ' token is written with the role chunk, the' +
      ' last with the finish reason, the usage chunk and `[DONE]`. Its floor runs the one' +
      ' conversation and the 100 again, with the service idle, through the bare parts alone' +
      ' (bench/lib/model-floor.mjs): two reader processes stream each answer from the fake model' +
      ' with the openai SDK and PUBLISH each text chunk (auto-pipelined), then store the answer' +
      " with one durable INSERT and PUBLISH it; two relays emit both on the clients' sockets." +
      ' Long histories are written' +
      " straight into the database through the service's store (`store.append`, 500 events a" +
      ' batch), then restored one at a time on fresh workers by a client that connects with' +
      " `latest_event_id` at the last event (no replay), and left hosted; memory is the workers'" +
      ' RSS and V8 heap before and after, each read right after a forced full GC (the bench' +
      ' agent module answers SIGUSR2 with `gc()` then `process.memoryUsage()` in workers started' +
      ' with `BENCH_MEMORY_PROBE=1`). The browser figures drive the' +
      ' web app served by a gateway in headless Chromium (playwright-core, /usr/bin/chromium):' +
      ' opening is from setting `#/c/<id>` to the first task after the animation frame in which' +
      " the newest answer is on screen; delta to paint is from the WebSocket frame's arrival in" +
      ' the page to the first task after the animation frame that follows its text entering the' +
      ' DOM. Sizes come from web/scripts/measure-sizes.mjs on what `npm run build` built' +
      ' (1 KB = 1,000 bytes here).',
    '',
  );
  return lines.join('\n');
}
