// The ConversationManager contract against the StandaloneConversationManager,
// on a real Postgres (a scratch database) and on the embedded PGlite, the two
// stores the standalone app runs on. Published traffic is recorded in-process.
import { rmSync } from 'node:fs';
import { AgentRegistry } from '@cs/agents';
import { StandaloneConversationManager } from '@cs/core';
import { openStore, type OpenedStore } from '@cs/store';
import { RecordingBroadcaster } from '../../libs/core/src/testing/recording-broadcaster.js';
import { standaloneDataDir } from '../support/migrated-template.js';
import { createEchoConversation, createScratchDatabase } from '../support/services.js';
import {
  conversationManagerContract,
  type ConversationManagerFixture,
} from './conversation-manager.contract.js';

const OWNER_ID = 'standalone-contract';

async function standaloneFixture(
  opened: OpenedStore,
  release: () => Promise<void>,
): Promise<ConversationManagerFixture> {
  const { store } = opened;
  const broadcaster = new RecordingBroadcaster();
  const agents = new AgentRegistry();
  const managers: StandaloneConversationManager[] = [];
  const errors: string[] = [];

  return Promise.resolve({
    agentHosts: [OWNER_ID],
    // stop() resolves once the session is gone; nothing runs in the background.
    untilUnheld: () => Promise.resolve(),

    createManager({ metrics, ...limits }) {
      const manager = new StandaloneConversationManager({
        store,
        broadcaster,
        agents,
        metrics,
        options: {
          ...limits,
          idleTimeoutMs: 3_600_000,
          maxIterations: 10,
          ownerId: OWNER_ID,
          cleanupIntervalMs: 60_000,
          catchUpIntervalMs: 250,
        },
        reportError: (text, error) => errors.push(`${text}: ${String(error)}`),
      });
      managers.push(manager);
      return Promise.resolve(manager);
    },

    createConversation: (owner) => createEchoConversation(store, owner),

    storedEvents: (ref) =>
      store.readEvents(ref.tenantId, ref.conversationId, { fromId: 0, limit: 10_000 }),
    storedConversation: (ref) => store.getConversation(ref.tenantId, ref.conversationId),
    publishedEvents: (id) => broadcaster.eventsOf(id),
    publishedStatuses: (id) => broadcaster.statusesOf(id),

    async teardown() {
      await Promise.all(managers.map((manager) => manager.shutdown()));
      await opened.close();
      await release();
      if (errors.length > 0) throw new Error(`unawaited failures:\n${errors.join('\n')}`);
    },
  });
}

conversationManagerContract('StandaloneConversationManager on Postgres', async () => {
  const scratch = await createScratchDatabase('cs_contract_sa', { migrated: true });
  const opened = await openStore({ databaseUrl: scratch.url, dataDir: '', migrate: true });
  return standaloneFixture(opened, () => scratch.drop());
});

conversationManagerContract('StandaloneConversationManager on PGlite', async () => {
  const dataDir = standaloneDataDir('cs-contract-');
  const opened = await openStore({ dataDir, migrate: true });
  return standaloneFixture(opened, () => {
    rmSync(dataDir, { recursive: true, force: true });
    return Promise.resolve();
  });
});
