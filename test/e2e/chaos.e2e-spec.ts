// A short chaos run as part of the suite: faults injected at random (seeded)
// into a private cluster under load, then every invariant checked
// (`npm run chaos -- --duration <s> --seed <n>` runs longer ones).
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../support/processes.js';

const SEED = process.env.CHAOS_SEED ?? '11';
const DURATION_S = process.env.CHAOS_DURATION ?? '60';

describe('chaos', () => {
  it(
    'loses, repeats and reorders nothing while processes, Redis and Postgres connections fail',
    async () => {
      const child = spawn(
        process.execPath,
        ['chaos/run.mjs', '--duration', DURATION_S, '--seed', SEED],
        {
          cwd: ROOT,
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      let output = '';
      child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
      const summary = output.trim().split('\n').at(-1) ?? '';
      expect(summary, output).toMatch(/^chaos: PASS seed=\d+ .* violations=0$/);
      expect(code, output).toBe(0);
      // The run did something: messages were acknowledged and faults injected.
      expect(Number(/acked=(\d+)/.exec(summary)?.[1])).toBeGreaterThan(50);
      expect(Number(/faults=(\d+)/.exec(summary)?.[1])).toBeGreaterThan(0);
    },
    Number(DURATION_S) * 1000 + 240_000,
  );
});
