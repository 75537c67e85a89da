// The long chaos run of `npm run test:soak`: 60 s (CHAOS_DURATION) of faults
// injected at random (seeded: CHAOS_SEED, 11 by default) into a private
// cluster under load, then every invariant checked. `npm test` runs a 10 s
// smoke of it (test/e2e/chaos.e2e-spec.ts).
import { describe, it } from 'vitest';
import { expectChaosPasses } from '../support/harness-runs.js';

const SEED = Number(process.env.CHAOS_SEED ?? '11');
const DURATION_S = Number(process.env.CHAOS_DURATION ?? '60');

describe('chaos', () => {
  it(
    'loses, repeats and reorders nothing while processes, Redis and Postgres connections fail',
    async () => {
      await expectChaosPasses({ durationS: DURATION_S, seed: SEED, ackedMoreThan: 50 });
    },
    DURATION_S * 1000 + 240_000,
  );
});
