// A standalone's SIGTERM with a socket client that stopped reading: it exits
// without waiting out its drain's deadline, saying goodbye to the live clients.
import { rmSync } from 'node:fs';
import type { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { CLIENT_DRAIN_TIMEOUT_MS } from '@cs/process';
import { ConversationClient, api, devToken } from '../support/clients.js';
import { openFrozenSocket } from '../support/frozen-socket.js';
import { startApp } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { standaloneDataDir } from '../support/migrated-template.js';

const SECRET = 'e2e-secret-0123456789abcdef-0123456789';

describe('standalone service shutdown', () => {
  it('exits promptly on SIGTERM although a socket client stopped answering; a live one is disconnected cleanly', async () => {
    const dir = standaloneDataDir('cs-e2e-');
    const app = await startApp('standalone', {
      DATA_DIR: dir,
      AUTH_JWT_SECRET: SECRET,
      AUTH_DEV_TOKENS: 'true',
    });
    let frozen: Socket | undefined;
    try {
      const token = await devToken(app.url, { user_id: 'frozen', tenant_id: uniqueName('frozen') });
      const created = await api<{ conversation_id: string }>(
        app.url,
        'POST',
        '/api/conversations',
        { token, body: {} },
      );
      expect(created.status).toBe(201);
      const id = created.body.conversation_id;
      frozen = await openFrozenSocket(app.url, token, { conversation_id: id });
      const live = await ConversationClient.connect(app.url, token, { conversation_id: id });
      const liveDisconnect = new Promise<string>((resolve) =>
        live.socket.once('disconnect', (reason) => resolve(reason)),
      );
      const signalledAt = Date.now();
      app.signal('SIGTERM');
      // The server said goodbye to the live one (a cut connection would be "transport close").
      await expect(liveDisconnect).resolves.toBe('io server disconnect');
      // Before the drain's deadline, which it would have waited out for the frozen one.
      const code = await Promise.race([
        app.exited,
        sleep(CLIENT_DRAIN_TIMEOUT_MS + 1_000).then(() => 'still running'),
      ]);
      const exitMs = Date.now() - signalledAt;
      expect(code, app.output()).toBe(0);
      expect(exitMs).toBeLessThan(CLIENT_DRAIN_TIMEOUT_MS - 1_000);
      expect(app.output()).not.toMatch(/drain timed out/);
    } finally {
      frozen?.destroy();
      await app.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
