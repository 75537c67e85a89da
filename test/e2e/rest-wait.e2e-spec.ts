// Waiting for an answer over REST (docs/protocol.md) on a standalone app:
// `Prefer: wait=<s>` on POST …/events answers with the turn once it ended (or
// awaits confirmation), and `GET …/turns/:event_id` reads a turn. The same
// scenarios run across a cluster in rest-wait-cluster.e2e-spec.ts.
import { afterAll, beforeAll, describe } from 'vitest';
import { startApp, type AppProcess } from '../support/processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';
import { AGENT_MODULE, signFor } from '../support/agent-runtime.js';
import { waitScenarios } from '../support/rest-wait.js';

const SECRET = 'rest-wait-e2e-secret-0123456789abcdef-0123';

describe('REST wait: a standalone app', () => {
  let app: AppProcess;
  let db: ScratchDatabase;
  const tenant = uniqueName('wait');

  beforeAll(async () => {
    db = await createScratchDatabase('cs_wait', { migrated: true });
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      AGENT_MODULES: AGENT_MODULE,
      MAX_CONCURRENT_CONVERSATIONS: '20',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
  });

  waitScenarios(
    () => [app.url, app.url],
    () => signFor(SECRET, uniqueName('user'), tenant),
  );
});
