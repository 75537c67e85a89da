#!/usr/bin/env node
// `npm run bench`: starts a throwaway local cluster (fresh database, fresh
// Redis key prefix, gateways and workers from dist/), runs the scenarios,
// prints p50 / p95 / p99, writes bench/results/<date>.json and BENCHMARKS.md,
// and tears everything down, also on errors and Ctrl-C.
//
//   npm run bench -- --quick
//   npm run bench -- --only round-trip,cold-start
//   npm run bench -- --only memory
//   npm run bench -- --only round-trip,sustained,redis-cluster
//   npm run bench -- --only capacity
//   npm run bench -- --only streaming,model-turn,long-history,sizes,browser
//   npm run bench -- --gateways 3 --workers 3 --sustained-conversations 1000 --duration 20
import { mkdtempSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Cluster } from './lib/cluster.mjs';
import { devToken } from './lib/client.mjs';
import { formatProfile, summarizeProfiles } from './lib/profile.mjs';
import { latestResults, renderFromResults, writeReports } from './lib/report.mjs';
import { runBuildingBlocks } from './scenarios/building-blocks.mjs';
import { runColdStart, runReplay, runRoundTrip } from './scenarios/conversation-latency.mjs';
import { runFailover } from './scenarios/failover.mjs';
import { runMemory } from './scenarios/memory.mjs';
import { runSustained } from './scenarios/sustained.mjs';
import { runStreaming } from './scenarios/streaming.mjs';
import { runLongHistory } from './scenarios/long-history.mjs';
import { runFork } from './scenarios/fork.mjs';
import { runProcessStart } from './scenarios/process-start.mjs';
import { runModelTurn } from './scenarios/model-turn.mjs';
import { startFakeModel } from './lib/fake-model.mjs';
import { runBrowser, runSizes } from './scenarios/web-client.mjs';
import { runRedisCluster } from './scenarios/redis-cluster.mjs';
import { runCapacity } from './scenarios/capacity.mjs';
import { runRestWait } from './scenarios/rest-wait.mjs';
import { runStop } from './scenarios/stop.mjs';
import { WEBHOOK_TENANT, runWebhooks } from './scenarios/webhooks.mjs';
import { startWebhookReceiver } from './lib/webhook-receiver.mjs';
import { runRetention, runUserExport } from './scenarios/data-lifecycle.mjs';

const SCENARIOS = [
  { name: 'building-blocks', title: 'Building blocks', run: runBuildingBlocks },
  { name: 'round-trip', title: 'Round trip (message → echo)', run: runRoundTrip },
  { name: 'rest-wait', title: 'Waited REST round trip (Prefer: wait)', run: runRestWait },
  { name: 'cold-start', title: 'Cold start', run: runColdStart },
  { name: 'process-start', title: 'Process start (spawn → ready)', run: runProcessStart },
  { name: 'replay', title: 'Reconnect replay', run: runReplay },
  { name: 'stop', title: 'Turn cut by a stop or an interrupt', run: runStop },
  { name: 'failover', title: 'Failover (kill -9)', run: (ctx) => runFailover(ctx, 'SIGKILL') },
  { name: 'handoff', title: 'Hand-off (SIGTERM)', run: (ctx) => runFailover(ctx, 'SIGTERM') },
  { name: 'sustained', title: 'Sustained load', run: runSustained },
  {
    name: 'redis-cluster',
    title: 'Redis Cluster (3 masters, CONVERSATION_QUEUES=8): round trip, sustained, failovers',
    run: runRedisCluster,
  },
  { name: 'streaming', title: 'Streaming (agent delta → client)', run: runStreaming },
  { name: 'model-turn', title: "Model turn (the service's overhead)", run: runModelTurn },
  { name: 'sizes', title: 'Client SDK and web app sizes', run: runSizes },
  { name: 'browser', title: 'Web app in headless Chromium', run: runBrowser },
  { name: 'memory', title: 'Memory', run: runMemory },
  { name: 'long-history', title: 'Long histories', run: runLongHistory },
  {
    name: 'capacity',
    title: 'Capacity: CPU, memory, Redis commands per unit of work (one Redis and a Redis Cluster)',
    run: runCapacity,
  },
  { name: 'webhooks', title: 'Webhook delivery lag', run: runWebhooks },
  { name: 'user-export', title: 'Export of a user (NDJSON)', run: runUserExport },
  {
    name: 'retention',
    title: 'Retention sweep of idle conversations under the sustained load at 500 msg/s',
    run: runRetention,
  },
  { name: 'fork', title: 'Fork of a long conversation', run: runFork },
];

const USAGE = `usage: npm run bench -- [options]
  --only a,b,…                   scenarios: ${SCENARIOS.map((s) => s.name).join(', ')}
                                 (default: all, in this order)
  --quick                        short run (fewer iterations; results go to <date>-quick.json)
  --gateways N, --workers M      cluster size (default 2 and 2)
  --lease-ttl-ms MS              LEASE_TTL_MS of the cluster (default 5000)
  --round-trips N                round trip iterations (default 500)
  --round-trip-warmup N          round trips sent first and not counted, so that the services'
                                 code is compiled by V8's optimizing compiler (default 2000)
  --failover-conversations N     conversations on the killed worker (default 100)
  --sustained-conversations N    clients of the sustained load (default 1000)
  --sustained-levels a,b,…       lower load levels measured first (default 1,10,100)
  --sustained-rates a,b,…        offered rates (msg/s) for the sustained conversations, each
                                 sending at its share of the rate (default 250,500,1000,1100,1250)
  --duration S                   seconds per sustained level (default 20)
  --streams N                    concurrent streams of the streaming scenario (default 200)
  --stream-seconds S             seconds of the one-stream and the 50 deltas/s levels (default 10)
  --stream-rates a,b,…           deltas/s per stream of the stepped levels: those below 50 first,
                                 those above it until p99 passes 50 ms (default 5,10,25,100,200,400,800)
  --step-seconds S               seconds per stepped level (default 6)
  --memory-sockets N             idle sockets for the gateway memory probe (default 10000)
  --memory-conversations N       idle conversations for the worker memory probe (default 5000)
  --model-turns N                turns of the one model conversation (default 25)
  --model-conversations N        concurrent model conversations (default 100)
  --model-ttft-ms MS, --model-token-ms MS, --model-tokens N
                                 the fake model: time to first token (default 100), time between
                                 tokens (default 20: 50 tokens/s), tokens an answer (default 50)
  --history-conversations N      conversations of the long-history scenario (default 50)
  --history-events N             events in each of their histories (default 10000)
  --capacity-rates a,b,c         paced rates (msg/s) of the capacity scenario (default 50,150,300)
  --capacity-conversations N     conversations they are spread over (default 300; --quick: 60)
  --webhook-conversations N      conversations of the webhooks scenario (default 1000)
  --webhook-rates a,b,…          offered turns/s of its paced levels (default 100,250,500)
  --webhook-cpu-rate N           the level at which the outbox's CPU is compared with webhooks
                                 off (default 250)
  --retention-conversations N    idle conversations of 100 events the retention sweep deletes
                                 under the load of --sustained-conversations (default 10000)
  --profile                      run the services with --cpu-prof and print where their CPU went
  --render                       only write BENCHMARKS.md (and the chart) again from the newest results
  --keep                         keep the database and the Redis keys
  --no-write                     print only; write neither results nor BENCHMARKS.md`;

function parseOptions(argv) {
  const { values } = parseArgs({
    args: argv,
    options: {
      only: { type: 'string' },
      quick: { type: 'boolean', default: false },
      gateways: { type: 'string', default: '2' },
      workers: { type: 'string', default: '2' },
      'lease-ttl-ms': { type: 'string', default: '5000' },
      'round-trips': { type: 'string', default: '500' },
      'round-trip-warmup': { type: 'string', default: '2000' },
      'cold-starts': { type: 'string', default: '50' },
      replays: { type: 'string', default: '10' },
      'replay-events': { type: 'string', default: '10000' },
      'failover-conversations': { type: 'string', default: '100' },
      'sustained-conversations': { type: 'string', default: '1000' },
      'sustained-levels': { type: 'string', default: '1,10,100' },
      'sustained-rates': { type: 'string', default: '250,500,1000,1100,1250' },
      duration: { type: 'string', default: '20' },
      streams: { type: 'string', default: '200' },
      'stream-seconds': { type: 'string', default: '10' },
      'stream-rates': { type: 'string', default: '5,10,25,100,200,400,800' },
      'step-seconds': { type: 'string', default: '6' },
      'memory-sockets': { type: 'string', default: '10000' },
      'memory-conversations': { type: 'string', default: '5000' },
      'model-turns': { type: 'string', default: '25' },
      'model-conversations': { type: 'string', default: '100' },
      'model-ttft-ms': { type: 'string', default: '100' },
      'model-token-ms': { type: 'string', default: '20' },
      'model-tokens': { type: 'string', default: '50' },
      'history-conversations': { type: 'string', default: '50' },
      'history-events': { type: 'string', default: '10000' },
      'capacity-rates': { type: 'string', default: '50,150,300' },
      'capacity-conversations': { type: 'string', default: '300' },
      'webhook-conversations': { type: 'string', default: '1000' },
      'webhook-rates': { type: 'string', default: '100,250,500' },
      'webhook-cpu-rate': { type: 'string', default: '250' },
      'retention-conversations': { type: 'string', default: '10000' },
      'worker-concurrency': { type: 'string', default: '10000' },
      keep: { type: 'boolean', default: false },
      render: { type: 'boolean', default: false },
      profile: { type: 'boolean', default: false },
      'no-write': { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
    strict: true,
  });
  const int = (name, min, max) => {
    const value = Number(values[name]);
    if (!Number.isInteger(value) || value < min || value > max) {
      throw new Error(`--${name} must be an integer in ${min}..${max} (got ${values[name]})`);
    }
    return value;
  };
  const only = values.only
    ? values.only
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
    : null;
  for (const name of only ?? []) {
    if (!SCENARIOS.some((s) => s.name === name)) throw new Error(`unknown scenario ${name}`);
  }
  return {
    help: values.help,
    only,
    quick: values.quick,
    keep: values.keep,
    render: values.render,
    profile: values.profile,
    write: !values['no-write'],
    gateways: int('gateways', 1, 8),
    workers: int('workers', 1, 8),
    leaseTtlMs: int('lease-ttl-ms', 1000, 60_000),
    roundTrips: int('round-trips', 1, 100_000),
    roundTripWarmup: int('round-trip-warmup', 0, 100_000),
    coldStarts: int('cold-starts', 1, 1000),
    replays: int('replays', 1, 100),
    replayEvents: int('replay-events', 1, 10_000),
    failoverConversations: int('failover-conversations', 1, 2000),
    sustainedConversations: int('sustained-conversations', 1, 5000),
    sustainedLevels: values['sustained-levels']
      .split(',')
      .filter(Boolean)
      .map((s) => Number(s))
      .filter((n) => Number.isInteger(n) && n > 0),
    sustainedRates: values['sustained-rates']
      .split(',')
      .filter(Boolean)
      .map((s) => Number(s))
      .filter((n) => Number.isFinite(n) && n > 0),
    durationS: int('duration', 2, 300),
    streams: int('streams', 2, 2000),
    streamSeconds: int('stream-seconds', 2, 300),
    streamRates: values['stream-rates']
      .split(',')
      .filter(Boolean)
      .map((s) => Number(s))
      .filter((n) => Number.isFinite(n) && n > 0),
    stepSeconds: int('step-seconds', 2, 300),
    memorySockets: int('memory-sockets', 10, 15_000),
    memoryConversations: int('memory-conversations', 10, 9_000),
    modelTurns: int('model-turns', 1, 10_000),
    modelConversations: int('model-conversations', 1, 2000),
    modelTtftMs: int('model-ttft-ms', 0, 60_000),
    modelTokenMs: int('model-token-ms', 1, 10_000),
    modelTokens: int('model-tokens', 1, 10_000),
    historyConversations: int('history-conversations', 1, 1000),
    historyEvents: int('history-events', 4, 100_000),
    capacityRates: values['capacity-rates']
      .split(',')
      .filter(Boolean)
      .map((s) => Number(s))
      .filter((n) => Number.isFinite(n) && n > 0),
    webhookConversations: int('webhook-conversations', 1, 5000),
    webhookRates: values['webhook-rates']
      .split(',')
      .filter(Boolean)
      .map((s) => Number(s))
      .filter((n) => Number.isFinite(n) && n > 0),
    webhookCpuRate: int('webhook-cpu-rate', 1, 100_000),
    capacityConversations: int('capacity-conversations', 1, 5000),
    retentionConversations: int('retention-conversations', 2, 100_000),
    workerConcurrency: int('worker-concurrency', 1, 100_000),
  };
}

/** The bench's agent module (bench_pacer), loaded by every gateway and worker. */
const BENCH_AGENTS = fileURLToPath(new URL('./agents/bench-agents.mjs', import.meta.url));

const log = (line) => process.stdout.write(`${line}\n`);

async function main() {
  let options;
  try {
    options = parseOptions(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`${error.message}\n${USAGE}\n`);
    process.exit(2);
  }
  if (options.help) {
    log(USAGE);
    return;
  }
  if (options.render) {
    const file = latestResults();
    if (!file) throw new Error('no results in bench/results/ yet: run the benchmark first');
    for (const path of renderFromResults(file)) log(`wrote ${path}`);
    return;
  }
  const selected = SCENARIOS.filter((s) => !options.only || options.only.includes(s.name));
  const profileDir = options.profile ? mkdtempSync(join(tmpdir(), 'bench-profiles-')) : null;
  // The `llm` agent's model server, started first: the services are given its URL.
  const model = selected.some((s) => s.name === 'model-turn')
    ? await startFakeModel({
        ttftMs: options.modelTtftMs,
        tokenMs: options.modelTokenMs,
        tokens: options.modelTokens,
      })
    : null;
  // The webhooks scenario's endpoint, started first: the services are given its URL. It
  // takes only its scenario's tenant, so that the other scenarios enqueue nothing.
  const webhookReceiver = selected.some((s) => s.name === 'webhooks')
    ? await startWebhookReceiver()
    : null;
  const cluster = new Cluster({
    gateways: options.gateways,
    workers: options.workers,
    leaseTtlMs: options.leaseTtlMs,
    workerConcurrency: options.workerConcurrency,
    log,
    nodeArgs: profileDir ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : [],
    env: {
      AGENT_MODULES: BENCH_AGENTS,
      ...(webhookReceiver
        ? {
            WEBHOOKS: JSON.stringify([
              {
                url: webhookReceiver.url,
                secret: webhookReceiver.secret,
                tenants: [WEBHOOK_TENANT],
              },
            ]),
          }
        : {}),
      // The retention scenario makes its conversations 2 days idle; nothing else is that old.
      RETENTION_DAYS: '1',
      RETENTION_SWEEP_INTERVAL_MS: '2000',
      ...(model
        ? {
            LLM_BASE_URL: model.url,
            LLM_MODEL: 'bench-model',
            LLM_API_KEY: 'bench-key',
            LLM_MAX_RETRIES: '0',
          }
        : {}),
    },
  });

  let stopping = false;
  const onSignal = (signal) => {
    if (stopping) {
      // A second signal, or one during the final clean-up: leave now (children are killed on exit).
      log(`\n${signal} again: exiting`);
      process.exit(130);
    }
    stopping = true;
    log(`\n${signal}: stopping the cluster …`);
    cluster.destroy({ keep: options.keep }).finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const startedAt = new Date();
  const loadAtStart = Math.round(loadavg()[0] * 100) / 100;
  log(`1-minute load average before the run: ${loadAtStart}`);
  const results = {};
  const failures = {};
  const runStarted = performance.now();
  try {
    const bootStarted = performance.now();
    await cluster.start();
    log(`cluster healthy in ${Math.round(performance.now() - bootStarted)} ms`);
    const tokens = new Map();
    const ctx = {
      cluster,
      options,
      log,
      results,
      model,
      webhookReceiver,
      upcoming: [],
      /** A development token for a user of the bench tenant (cached). */
      async token(userId) {
        if (!tokens.has(userId))
          tokens.set(userId, await devToken(cluster.gateways[0].url, userId, 'bench'));
        return tokens.get(userId);
      },
    };
    for (const [index, scenario] of selected.entries()) {
      if (stopping) break;
      ctx.upcoming = selected.slice(index + 1).map((s) => s.name);
      log(`\n▶ ${scenario.title}`);
      const started = performance.now();
      try {
        results[scenario.name] = await scenario.run(ctx);
        results[scenario.name].elapsedS = Math.round((performance.now() - started) / 100) / 10;
      } catch (error) {
        failures[scenario.name] = error instanceof Error ? error.message : String(error);
        log(`  ✗ ${scenario.name} failed: ${failures[scenario.name]}`);
      }
      log(`  (${Math.round((performance.now() - started) / 1000)} s)`);
    }
  } catch (error) {
    failures.cluster = error instanceof Error ? error.message : String(error);
    log(`✗ ${failures.cluster}`);
  } finally {
    if (!stopping) {
      stopping = true;
      log('\nstopping the cluster …');
      await cluster.destroy({ keep: options.keep });
    }
    await model?.stop();
    await webhookReceiver?.stop();
  }
  if (profileDir) {
    log(`\nCPU profiles of the services (open in Chrome DevTools): ${profileDir}`);
    const names = new Map(
      [...cluster.gateways, ...cluster.workers, ...cluster.retired].map((p) => [p.pid, p.name]),
    );
    for (const [file, summary] of Object.entries(summarizeProfiles(profileDir))) {
      const pid = Number(file.split('.')[3]);
      log(formatProfile(`${names.get(pid) ?? 'pid ' + pid} (${file})`, summary));
    }
  }
  const elapsedS = Math.round((performance.now() - runStarted) / 1000);
  log(`done in ${elapsedS} s`);
  if (options.write) {
    const written = await writeReports({
      options,
      startedAt,
      elapsedS,
      loadAtStart,
      results,
      failures,
      cluster,
    });
    for (const path of written) log(`wrote ${path}`);
  }
  // Exit explicitly: a client library's idle handle must not keep the harness alive.
  process.exit(Object.keys(failures).length > 0 ? 1 : 0);
}

await main();
