// The chaos smoke of `npm test`: 10 s of faults injected at random (seeded)
// into a private cluster under load, then every invariant checked. Seed 5
// restarts Redis and kills a worker with SIGKILL within those 10 s. The 60 s
// run is in `npm run test:soak` (test/soak/chaos.soak-spec.ts);
// `npm run chaos -- --duration <s> --seed <n>` runs any other.
import { describe, it } from 'vitest';
import { expectChaosPasses } from '../support/harness-runs.js';

const SEED = Number(process.env.CHAOS_SEED ?? '5');
const DURATION_S = 10;

describe('chaos (smoke)', () => {
  it(
    'loses, repeats and reorders nothing while processes, Redis and Postgres connections fail',
    async () => {
      await expectChaosPasses({ durationS: DURATION_S, seed: SEED, ackedMoreThan: 10 });
    },
    DURATION_S * 1000 + 180_000,
  );
});
