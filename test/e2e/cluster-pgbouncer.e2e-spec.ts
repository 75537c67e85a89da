// The cluster's chat through PgBouncer in transaction mode (Debian's
// `pgbouncer`, started by the test), with prepared statements off and a small
// pool: two gateways and two workers deliver every stored event once and in
// order to clients on both gateways. Run once, on one Redis: PgBouncer sits
// in front of Postgres whatever the Redis layout (cluster-chat.e2e-spec.ts
// runs the same chat on both layouts, straight to Postgres).
import { describe, it } from 'vitest';
import { chatAcrossGateways, clusterPerTest } from '../support/cluster-conversations.js';
import { startPgBouncer } from '../support/pgbouncer.js';

const fixture = clusterPerTest();

describe('a cluster through PgBouncer', () => {
  it('delivers every stored event once and in order to clients on both gateways, in transaction mode with prepared statements off', async () => {
    fixture.bouncer = await startPgBouncer();
    const through = fixture.bouncer;
    await chatAcrossGateways(
      await fixture.start({
        gateways: 2,
        workers: 2,
        databaseUrl: (direct) => through.urlFor(direct),
        env: { DATABASE_PREPARED_STATEMENTS: 'false', DATABASE_POOL_SIZE: '4' },
      }),
    );
  });
});
