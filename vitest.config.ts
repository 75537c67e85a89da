import { fileURLToPath } from 'node:url';
import swc from 'unplugin-swc';
import { defineConfig } from 'vitest/config';

const lib = (name: string) =>
  fileURLToPath(new URL(`./libs/${name}/src/index.ts`, import.meta.url));

const alias = {
  '@cs/protocol': lib('protocol'),
  '@cs/core': lib('core'),
  '@cs/store': lib('store'),
  '@cs/config': lib('config'),
  '@cs/agents': lib('agents'),
  '@cs/cluster': lib('cluster'),
  '@cs/gateway': lib('gateway'),
  '@cs/observability': lib('observability'),
  '@cs/process': lib('process'),
  '@cs/client': lib('client'),
  '@cs/webhooks': lib('webhooks'),
};

// SWC compiles the sources so that Nest's decorator metadata works in tests.
const plugins = [swc.vite({ module: { type: 'es6' } })];

// Checks that Postgres and Redis answer, once per project that needs them:
// the unit and manifests projects run with both down.
const needsServices = ['./test/global-setup.ts'];

// Files run three at a time on this 2-core machine: two at a time left a core
// idle a third of the time (processes starting, tests waiting on a lease or a
// timer). Measured on the end-to-end group: 349 s at 67 % of both cores with
// two, 300 s at 87 % with three (2026-12-07); unit and integration: 67 s, 55 s.
const FILES_AT_ONCE = 3;

// The deployment files' checks read files and run no service.
const MANIFESTS = ['test/integration/deploy-manifests.int-spec.ts'];

// End-to-end files that run one at a time, after everything else, because
// they fail Redis masters over with a 2 s node timeout, which a node left
// waiting for a core beside other files would trip: redis-cluster under load,
// and the chaos smoke on a Redis Cluster, which adds master kills and
// failovers to its faults. Every other file runs three at a time, the chaos
// smoke on one Redis and the bench smoke too (they check invariants and what
// a run reports, never a time): a bound on time there only tells a working
// mechanism from a broken one (test/support/bounds.ts), and the figures are
// the bench's.
const E2E_SERIAL = [
  'test/e2e/chaos-redis-cluster.e2e-spec.ts',
  'test/e2e/redis-cluster.e2e-spec.ts',
];

/** Run a second time on a Redis Cluster (`TEST_REDIS=cluster`), beside the other e2e files. */
const E2E_ON_REDIS_CLUSTER = [
  'test/e2e/cluster.e2e-spec.ts',
  'test/e2e/cluster-chat.e2e-spec.ts',
  'test/e2e/agent-runtime-cluster.e2e-spec.ts',
  'test/e2e/agents-cluster.e2e-spec.ts',
  'test/e2e/budgets-cluster.e2e-spec.ts',
  'test/e2e/rest-wait-cluster.e2e-spec.ts',
];
/** An end-to-end project: built processes on Postgres and Redis, two minutes a test. */
function e2eProject(project: {
  name: string;
  include: string[];
  exclude?: string[];
  env?: Record<string, string>;
  maxWorkers: number;
  groupOrder: number;
  /** Run once before the project's files, after the services' check. */
  globalSetup?: string[];
}) {
  const { groupOrder, globalSetup = [], ...test } = project;
  return {
    plugins,
    resolve: { alias },
    test: {
      ...test,
      environment: 'node' as const,
      globalSetup: [...needsServices, ...globalSetup],
      testTimeout: 120_000,
      hookTimeout: 120_000,
      // As for the unit and integration files: a worker keeps its loaded
      // modules (vitest, the test support, the libs through SWC) from file to
      // file instead of a new process importing them for each. What a file
      // starts (processes, a Redis Cluster, PgBouncer) its own hooks stop.
      isolate: false,
      sequence: { groupOrder },
    },
  };
}

export default defineConfig({
  plugins,
  resolve: { alias },
  test: {
    // Projects with the same groupOrder run together, groups one after the
    // other, so that the processes of end-to-end files never share the
    // machine with the integration suites' timings: unit, manifests and
    // integration three files at a time, then the e2e files three at a time,
    // then the serial e2e files one at a time.
    projects: [
      {
        plugins,
        resolve: { alias },
        test: {
          name: 'unit',
          include: [
            'apps/**/*.spec.ts',
            'libs/**/*.spec.ts',
            'web/src/**/*.spec.ts',
            // the fakes' own specs, such as the in-memory store's contract run
            'test/fakes/**/*.spec.ts',
          ],
          environment: 'node',
          // A few specs spin the CPU on purpose (an agent that never ends its
          // step, a 1 MiB nested body): 5 s was too short beside another file
          // on two busy cores.
          testTimeout: 20_000,
          maxWorkers: FILES_AT_ONCE,
          // Files share their worker and its loaded modules (isolated, each
          // file paid a new process and the import of its whole module graph:
          // most of this project's time). A spec restores what it changes of
          // the process (env, timers, listeners, OpenTelemetry's globals).
          isolate: false,
          unstubEnvs: true,
          unstubGlobals: true,
          sequence: { groupOrder: 0 },
        },
      },
      {
        plugins,
        resolve: { alias },
        test: {
          name: 'manifests',
          include: MANIFESTS,
          environment: 'node',
          testTimeout: 60_000,
          hookTimeout: 60_000,
          maxWorkers: FILES_AT_ONCE,
          sequence: { groupOrder: 0 },
        },
      },
      {
        plugins,
        resolve: { alias },
        test: {
          name: 'integration',
          include: ['test/integration/**/*.int-spec.ts'],
          exclude: MANIFESTS,
          environment: 'node',
          globalSetup: needsServices,
          testTimeout: 60_000,
          hookTimeout: 60_000,
          maxWorkers: FILES_AT_ONCE,
          // As for the unit files: a worker and its modules (Nest, PGlite's
          // WebAssembly, warm after its first database) serve file after file.
          isolate: false,
          sequence: { groupOrder: 0 },
        },
      },
      e2eProject({
        name: 'e2e',
        include: ['test/e2e/**/*.e2e-spec.ts'],
        exclude: E2E_SERIAL,
        maxWorkers: FILES_AT_ONCE,
        groupOrder: 1,
      }),
      e2eProject({ name: 'e2e-serial', include: E2E_SERIAL, maxWorkers: 1, groupOrder: 2 }),
      // The cluster suites again, the same test bodies, on a local Redis
      // Cluster that the project starts once for its files (test/support/test-redis.ts).
      e2eProject({
        name: 'e2e-redis-cluster',
        include: E2E_ON_REDIS_CLUSTER,
        env: { TEST_REDIS: 'cluster' },
        globalSetup: ['./test/redis-cluster-setup.ts'],
        maxWorkers: FILES_AT_ONCE,
        groupOrder: 1,
      }),
      {
        // `npm run test:soak`, never part of `npm test`: the 60 s chaos run
        // and every benchmark scenario.
        plugins,
        resolve: { alias },
        test: {
          name: 'soak',
          include: ['test/soak/**/*.soak-spec.ts'],
          environment: 'node',
          globalSetup: needsServices,
          testTimeout: 600_000,
          hookTimeout: 120_000,
          maxWorkers: 1,
          sequence: { groupOrder: 3 },
        },
      },
    ],
  },
});
