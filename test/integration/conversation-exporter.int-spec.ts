// The export of a conversation (ConversationExporter) on PGlite, to a client
// that is behind: each write waits until the test lets it through. While it
// waits, the exporter holds nothing of the page it wrote (a page kept across
// a slow client's wait outlives young collections and is promoted to the old
// generation). V8's collector is run by the test: `gc()` exposed at run time.
import { randomUUID } from 'node:crypto';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { EventDraft, NewConversation } from '@cs/core';
import type { SqlDatabase } from '@cs/store';
import { PostgresConversationStore, migrate } from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConversationExporter } from '../../libs/gateway/src/lifecycle/conversation-exporter.js';
import type { NdjsonSink } from '../../libs/gateway/src/lifecycle/ndjson-response.js';
import { openMigratedPglite } from '../support/migrated-template.js';
import { uniqueName } from '../support/services.js';

setFlagsFromString('--expose-gc');
const collectGarbage = runInNewContext('gc') as () => void;

/** One macrotask: past the job that made a WeakRef, which keeps its target until then. */
const nextTurn = () => new Promise((resolve) => setImmediate(resolve));

function message(n: number): EventDraft {
  const content = `message ${n}`;
  return { source: 'user', body: { action: 'message', args: { content }, message: content } };
}

/** A client that takes each write only when told; what each write was given, weakly. */
function slowClient() {
  const writes: { values: WeakRef<readonly unknown[]>; count: number; take: () => void }[] = [];
  let announce: () => void = () => undefined;
  const sink: NdjsonSink = {
    write(values) {
      return new Promise<void>((take) => {
        writes.push({ values: new WeakRef(values), count: values.length, take });
        announce();
      });
    },
  };
  /** The next write, once the exporter has made it. */
  const next = async (index: number) => {
    while (writes.length <= index) await new Promise<void>((resolve) => (announce = resolve));
    return writes[index]!;
  };
  return { sink, next };
}

describe(ConversationExporter.name, () => {
  let database: SqlDatabase;
  let store: PostgresConversationStore;

  beforeAll(async () => {
    database = await openMigratedPglite();
    await migrate(database);
    store = new PostgresConversationStore(database);
  });

  afterAll(async () => {
    await database?.close();
  });

  it('holds none of the events it wrote while the client is behind', async () => {
    const tenantId = uniqueName('t');
    const conversation: NewConversation = {
      id: randomUUID(),
      tenantId,
      userId: 'u',
      appName: 'default',
      title: '',
      metadata: {},
      agent: { name: 'echo', config: {} },
      instructions: null,
    };
    await store.createConversation(conversation);
    const total = 1200; // three pages of events
    for (let n = 0; n < total; n += 400) {
      await store.append(
        tenantId,
        conversation.id,
        Array.from({ length: 400 }, (_, k) => message(n + k)),
      );
    }
    const client = slowClient();
    const exported = new ConversationExporter(store, 'interrupt').export(
      tenantId,
      conversation.id,
      client.sink,
    );

    const info = await client.next(0);
    expect(info.count).toBe(1);
    info.take();
    let events = 0;
    for (let index = 1; events < total; index += 1) {
      const page = await client.next(index);
      events += page.count;
      // The exporter is waiting for this write: nothing but the client refers to the page.
      await nextTurn();
      collectGarbage();
      expect(page.values.deref(), `page ${index} after a collection`).toBeUndefined();
      page.take();
    }
    (await client.next(4)).take(); // `{ state }`
    expect(await exported).toBe(total);
    expect(events).toBe(total);
  });
});
