// Budgets (docs/protocol.md "Usage and budgets") on the standalone app, with
// its in-process ledger: each model request's worst case is held before it is
// sent, so 20 concurrent turns of one user against a budget of 5.5 USD a day
// send 5 requests to the model, and the 15 others end in `error`
// (`budget_exhausted`) without reaching it. The cluster's run, on Redis
// scripts, is budgets-cluster.e2e-spec.ts.
import { afterAll, beforeAll, describe, it } from 'vitest';
import type { FakeModelServer } from '../fakes/fake-model-server.js';
import { BUDGET_ENV, expectFiveOfTwenty, fakeModel } from '../support/budgets.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { signFor } from '../support/agent-runtime.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';

const SECRET = 'budgets-e2e-secret-0123456789abcdef-0123';

describe('budgets on the standalone app', () => {
  let model: FakeModelServer;
  let db: ScratchDatabase;
  let app: AppProcess;

  beforeAll(async () => {
    model = await fakeModel();
    db = await createScratchDatabase('cs_budgets', { migrated: true });
    app = await startApp('standalone', {
      ...BUDGET_ENV,
      LLM_BASE_URL: `${model.url}/v1`,
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
    await model?.close();
  });

  it('sends 5 of 20 concurrent requests of one user', async () => {
    const token = await signFor(SECRET, uniqueName('spender'), uniqueName('tenant'));
    await expectFiveOfTwenty([app.url], token, model, [app.url]);
  });
});
