// The chaos smoke on a local Redis Cluster (`npm run chaos -- --redis-cluster`:
// 3 masters with a replica each, CONVERSATION_QUEUES=8): seed 8 kills a Redis
// master first (its replica takes over, the node comes back as a replica),
// then a gateway, within its 12 s of faults; every invariant is checked as on
// one Redis (test/e2e/chaos.e2e-spec.ts).
import { describe, it } from 'vitest';
import { expectChaosPasses } from '../support/harness-runs.js';

const SEED = Number(process.env.CHAOS_SEED ?? '8');
const DURATION_S = 12;

describe('chaos on a Redis Cluster (smoke)', () => {
  it(
    'loses, repeats and reorders nothing while masters die or fail over beside process faults',
    async () => {
      await expectChaosPasses({
        durationS: DURATION_S,
        seed: SEED,
        ackedMoreThan: 10,
        redisCluster: true,
      });
    },
    DURATION_S * 1000 + 240_000,
  );
});
