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
};

// SWC compiles the sources so that Nest's decorator metadata works in tests.
const plugins = [swc.vite({ module: { type: 'es6' } })];

export default defineConfig({
  plugins,
  resolve: { alias },
  test: {
    globalSetup: ['./test/global-setup.ts'],
    projects: [
      {
        plugins,
        resolve: { alias },
        test: {
          name: 'unit',
          include: ['apps/**/*.spec.ts', 'libs/**/*.spec.ts', 'web/src/**/*.spec.ts'],
          environment: 'node',
        },
      },
      {
        plugins,
        resolve: { alias },
        test: {
          name: 'integration',
          include: ['test/integration/**/*.int-spec.ts'],
          environment: 'node',
          testTimeout: 60_000,
          hookTimeout: 60_000,
        },
      },
      {
        plugins,
        resolve: { alias },
        test: {
          name: 'e2e',
          include: ['test/e2e/**/*.e2e-spec.ts'],
          environment: 'node',
          testTimeout: 120_000,
          hookTimeout: 120_000,
          fileParallelism: false,
        },
      },
    ],
  },
});
