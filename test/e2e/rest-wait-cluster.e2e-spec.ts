// Waiting for an answer over REST (docs/protocol.md) across two gateways and
// two workers: the waiting gateway is not the one that hosts the conversation,
// and hears the end on the conversation's channel. Run on one Redis and again
// on a Redis Cluster; the standalone app's run is rest-wait.e2e-spec.ts.
import { afterAll, beforeAll, describe } from 'vitest';
import { startCluster, type TestCluster } from '../support/cluster.js';
import { uniqueName } from '../support/services.js';
import { AGENT_MODULE } from '../support/agent-runtime.js';
import { waitScenarios } from '../support/rest-wait.js';
import { useTestRedis } from '../support/test-redis.js';

useTestRedis();

describe('REST wait: two gateways and two workers', () => {
  let cluster: TestCluster;

  beforeAll(async () => {
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      env: { AGENT_MODULES: AGENT_MODULE, MAX_CONCURRENT_CONVERSATIONS: '20' },
    });
  });

  afterAll(async () => {
    await cluster?.close();
  });

  waitScenarios(
    () => [cluster.gateways[0]!.url, cluster.gateways[1]!.url],
    () => cluster.token(uniqueName('user')),
  );
});
