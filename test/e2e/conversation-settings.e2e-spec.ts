// Conversation settings changed with PATCH apply from the next action on,
// to sockets opened before the change and to the running agent, on a
// standalone app and across the gateways of a cluster (issue 24: a socket
// kept the multitask strategy of its handshake).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerEvent, StoredEvent } from '@cs/protocol';
import { ConversationClient, api, isAgentReply } from '../support/clients.js';
import { startCluster, type TestCluster } from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';
import { AGENT_MODULE, deltasOf, signFor } from '../support/agent-runtime.js';

const SECRET = 'settings-e2e-secret-0123456789abcdef-0123';

async function created(url: string, token: string, body: Record<string, unknown>) {
  const answer = await api(url, 'POST', '/api/conversations', { token, body });
  expect(answer.status, JSON.stringify(answer.body)).toBe(201);
  return answer.body.conversation_id as string;
}

async function patch(url: string, token: string, id: string, body: Record<string, unknown>) {
  const answer = await api(url, 'PATCH', `/api/conversations/${id}`, { token, body });
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
}

const isStateChange = (event: ServerEvent, state: string, cause: number) =>
  'observation' in event &&
  event.observation === 'agent_state_changed' &&
  event.extras['agent_state'] === state &&
  event.cause === cause;

/**
 * The scenarios, against `first` and `second` (the same app, or two gateways
 * of a cluster): sockets of `first`, PATCHes alternating between both.
 */
function settingsScenarios(urls: () => [string, string], token: () => Promise<string>) {
  it('applies a PATCH of multitask_strategy to open sockets and the running agent from the next message on', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'waiter' });
    const early = await ConversationClient.connect(first, user, { conversation_id: id });
    const long = await early.message('a long turn');
    expect(long.ok).toBe(true);
    const longId = long.ok ? long.event_id : -1;
    await early.waitFor((events) => deltasOf(events, longId).length > 0, 15_000, 'the long turn');

    // Opened under enqueue, refused once the conversation rejects.
    await patch(second, user, id, { multitask_strategy: 'reject' });
    expect(await early.message('quick, refused')).toMatchObject({
      ok: false,
      error: { code: 'AGENT_BUSY' },
    });

    // Opened under reject, taken once the conversation enqueues again.
    const late = await ConversationClient.connect(first, user, {
      conversation_id: id,
      start: 'false',
    });
    await patch(second, user, id, { multitask_strategy: 'enqueue' });
    const queued = await late.message('quick, queued');
    expect(queued.ok).toBe(true);

    // Under interrupt, the next message cuts the running turn and is answered.
    await patch(second, user, id, { multitask_strategy: 'interrupt' });
    const cutting = await late.message('quick, interrupting');
    expect(cutting.ok).toBe(true);
    const cuttingId = cutting.ok ? cutting.event_id : -1;
    await late.waitFor(
      (events) =>
        events.some(
          (e) =>
            'action' in e &&
            e.source === 'agent' &&
            e.cause === longId &&
            e.args['interrupted'] === true,
        ),
      10_000,
      'the long turn cut',
    );
    await late.waitForReply(cuttingId, 10_000);

    const page = await api(second, 'GET', `/api/conversations/${id}/events?limit=100`, {
      token: user,
    });
    const contents = (page.body.events as StoredEvent[]).flatMap((e) =>
      'action' in e && e.source === 'user' ? [e.args['content']] : [],
    );
    expect(contents).toEqual(['a long turn', 'quick, queued', 'quick, interrupting']);
    early.close();
    late.close();
  });

  it('applies a PATCH of confirmation_mode to the running agent from its next turn on', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'tool_user' });
    const socket = await ConversationClient.connect(first, user, { conversation_id: id });
    const ask = async (content: string) => {
      const ack = await socket.message(content);
      expect(ack.ok, JSON.stringify(ack)).toBe(true);
      return ack.ok ? ack.event_id : -1;
    };

    const free = await ask('what time is it?');
    await socket.waitForReply(free, 15_000);
    await patch(second, user, id, { confirmation_mode: true });
    const guarded = await ask('and now?');
    await socket.waitFor(
      (events) => events.some((e) => isStateChange(e, 'awaiting_user_confirmation', guarded)),
      10_000,
      'a confirmation asked for',
    );
    expect(socket.events.some((e) => isAgentReply(e, guarded))).toBe(false);
    await patch(second, user, id, { confirmation_mode: false });
    const confirmed = await socket.send({
      action: 'change_agent_state',
      args: { agent_state: 'user_confirmed' },
    });
    expect(confirmed.ok).toBe(true);
    await socket.waitForReply(guarded, 10_000);
    const again = await ask('once more?');
    await socket.waitForReply(again, 10_000);
    expect(socket.events.some((e) => isStateChange(e, 'awaiting_user_confirmation', again))).toBe(
      false,
    );
    socket.close();
  });
}

describe('conversation settings: a standalone app', () => {
  let app: AppProcess;
  let db: ScratchDatabase;
  const tenant = uniqueName('settings');

  beforeAll(async () => {
    db = await createScratchDatabase('cs_settings', { migrated: true });
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      AGENT_MODULES: AGENT_MODULE,
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
  });

  settingsScenarios(
    () => [app.url, app.url],
    () => signFor(SECRET, uniqueName('user'), tenant),
  );
});

describe('conversation settings: a cluster of two gateways', () => {
  let cluster: TestCluster;

  beforeAll(async () => {
    cluster = await startCluster({
      gateways: 2,
      workers: 1,
      env: { AGENT_MODULES: AGENT_MODULE },
    });
  });

  afterAll(async () => {
    await cluster?.close();
  });

  settingsScenarios(
    () => [cluster.gateways[0]!.url, cluster.gateways[1]!.url],
    () => cluster.token(uniqueName('user')),
  );
});
