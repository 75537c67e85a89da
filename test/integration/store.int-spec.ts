// The Postgres store on what only a SQL database shows: statement and
// transaction counts, shared statements across conversations, deadlocks
// between processes, stored columns, migrations, the DATA_DIR lock. On real
// Postgres (a scratch database), through PgBouncer, and on PGlite. The
// behaviour every store shares is store.contract.ts, run on these databases
// by postgres-store.contract.int-spec.ts.
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ConversationStore, NewConversation } from '@cs/core';
import { LeaseLostError } from '@cs/core';
import type { SqlDatabase } from '@cs/store';
import { sqlErrorCode } from '@cs/store';
import {
  DataDirLockedError,
  PostgresConversationStore,
  WriteClock,
  loadMigrations,
  lockDataDir,
  migrate,
  openEmbeddedDatabase,
  openPostgres,
  openStore,
} from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPgBouncer } from '../support/pgbouncer.js';
import { createScratchDatabase, uniqueName } from '../support/services.js';
import { SQL_BACKENDS } from '../support/sql-backends.js';
import { agentStateChanged, message, newConversation, step } from './store.contract.js';

async function countEvents(database: SqlDatabase, conversationId: string): Promise<number> {
  const { rows } = await database.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM events WHERE conversation_id = $1',
    [conversationId],
  );
  return rows[0]!.n;
}

/**
 * The database with a count of the statements run outside transactions and of
 * transactions, and the error codes of the statements that failed.
 */
function countingDatabase(database: SqlDatabase): {
  database: SqlDatabase;
  calls: { statements: number; transactions: number; errors: string[] };
} {
  const calls = { statements: 0, transactions: 0, errors: [] as string[] };
  const counted = Object.create(database) as SqlDatabase;
  counted.query = async (...args) => {
    calls.statements += 1;
    try {
      return await database.query(...args);
    } catch (error) {
      calls.errors.push(sqlErrorCode(error) ?? 'unknown');
      throw error;
    }
  };
  counted.transaction = (fn) => {
    calls.transactions += 1;
    return database.transaction(fn);
  };
  return { database: counted, calls };
}

describe.each(SQL_BACKENDS)('PostgresConversationStore on $name', (backend) => {
  let database: SqlDatabase;
  let store: ConversationStore;
  let teardown: () => Promise<void>;
  let another: () => SqlDatabase | null;

  beforeAll(async () => {
    ({ database, another, teardown } = await backend.open({ migrated: true }));
    await migrate(database);
    store = new PostgresConversationStore(database);
  });

  afterAll(async () => {
    await teardown?.();
  });

  async function created(overrides: Partial<NewConversation> = {}) {
    return (await store.createConversation(newConversation(overrides))).conversation;
  }

  describe('migrations', () => {
    it('applies nothing the second time', async () => {
      expect(await migrate(database)).toEqual([]);
      const { rows } = await database.query<{ name: string }>(
        'SELECT name FROM schema_migrations ORDER BY name',
      );
      expect(rows.map((row) => row.name)).toEqual((await loadMigrations()).map((m) => m.name));
    });
  });

  describe('append', () => {
    it('writes a plain append in one statement, and takes a transaction only when it must', async () => {
      const conversation = await created();
      const counted = countingDatabase(database);
      const counting = new PostgresConversationStore(counted.database);
      const { tenantId, id } = conversation;

      await counting.append(tenantId, id, [message('plain', { clientEventId: 'k1' })]);
      await counting.append(tenantId, id, [agentStateChanged('running'), message('two')], {});
      expect(counted.calls).toEqual({ statements: 2, transactions: 0, errors: [] });

      // A stored key, a user: key and a stale epoch need the transaction's reads.
      await counting.append(tenantId, id, [message('plain', { clientEventId: 'k1' })]);
      await counting.append(tenantId, id, [message('x', { stateDelta: { 'user:tz': 'UTC' } })]);
      await expect(
        counting.append(tenantId, id, [message('late')], { leaseEpoch: 7 }),
      ).rejects.toBeInstanceOf(LeaseLostError);
      expect(counted.calls.transactions).toBe(3);
      const events = await store.readEvents(tenantId, id, { limit: 10 });
      expect(events.map((e) => e.id)).toEqual([0, 1, 2, 3]);
    });

    it('writes concurrent appends to many conversations in shared statements, each as if alone', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 40 }, () => created({ tenantId })),
      );
      const [stale, repeated] = conversations;
      await store.append(tenantId, repeated!.id, [message('first', { clientEventId: 'dup' })]);
      const epoch = await store.acquireLease(tenantId, stale!.id, 'worker-a');
      const counted = countingDatabase(database);
      const counting = new PostgresConversationStore(counted.database);

      const results = await Promise.allSettled(
        conversations.map((conversation, i) =>
          counting.append(
            tenantId,
            conversation.id,
            conversation === repeated
              ? [message('first', { clientEventId: 'dup' })]
              : [message(`m${i}`, { stateDelta: { n: i } }), agentStateChanged('running')],
            { leaseEpoch: conversation === stale ? epoch - 1 : undefined },
          ),
        ),
      );

      expect(results[0]).toMatchObject({ status: 'rejected', reason: expect.any(LeaseLostError) });
      expect(results[1]).toMatchObject({ status: 'fulfilled', value: [{ duplicate: true }] });
      for (const [i, result] of results.entries()) {
        if (i < 2) continue;
        const conversation = conversations[i]!;
        expect(result).toMatchObject({
          status: 'fulfilled',
          value: [{ event: { id: 0, message: `m${i}` } }, { event: { id: 1 } }],
        });
        const snapshot = await store.getSnapshot(tenantId, conversation.id);
        expect(snapshot).toMatchObject({
          conversation: { lastEventId: 1, agentState: 'running' },
          state: { n: i },
        });
      }
      expect(await countEvents(database, stale!.id)).toBe(0);
      expect(await countEvents(database, repeated!.id)).toBe(1);
      // Appends that queued behind the first few shared statements.
      expect(counted.calls.statements).toBeLessThan(conversations.length / 2);
    });

    it('writes each append in a statement of its own conversation with cross-conversation batches off', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 12 }, () => created({ tenantId })),
      );
      const counted = countingDatabase(database);
      const recorded: string[] = [];
      const query = counted.database.query.bind(counted.database);
      counted.database.query = (sql, params, options) => {
        recorded.push(sql);
        return query(sql, params, options);
      };
      const unbatched = new PostgresConversationStore(counted.database, {
        crossConversationBatches: false,
      });
      const results = await Promise.all(
        conversations.map((conversation, i) =>
          unbatched.append(tenantId, conversation.id, [
            message(`m${i}`, { stateDelta: { n: i } }),
            agentStateChanged('running'),
          ]),
        ),
      );
      for (const [i, result] of results.entries()) {
        expect(result.map((a) => [a.event.id, a.duplicate])).toEqual([
          [0, false],
          [1, false],
        ]);
        expect(await store.getSnapshot(tenantId, conversations[i]!.id)).toMatchObject({
          conversation: { lastEventId: 1, agentState: 'running' },
          state: { n: i },
        });
      }
      expect(counted.calls).toEqual({ statements: 12, transactions: 0, errors: [] });
      expect(recorded.some((sql) => sql.includes('jsonb_to_recordset($1::jsonb)'))).toBe(false);
    });

    it('never deadlocks when two processes append to the same conversations in opposite orders', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 20 }, () => created({ tenantId })),
      );
      const other = another();
      const databases = [countingDatabase(database), countingDatabase(other ?? database)];
      try {
        const stores = databases.map((each) => new PostgresConversationStore(each.database));
        for (let round = 0; round < 5; round += 1) {
          await Promise.all(
            stores.flatMap((each, s) =>
              (s === 0 ? conversations : [...conversations].reverse()).map((conversation) =>
                each.append(tenantId, conversation.id, [message(`round ${round}`)]),
              ),
            ),
          );
        }
        for (const conversation of conversations) {
          const events = await store.readEvents(tenantId, conversation.id, { limit: 20 });
          expect(events.map((e) => e.id)).toEqual([...Array(10).keys()]);
        }
        // A deadlock would be retried and go unnoticed but for its error (40P01).
        expect(databases.flatMap((each) => each.calls.errors)).toEqual([]);
      } finally {
        await other?.close();
      }
    });

    it('counts the turn cost of appends that share a statement, each as if alone', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 20 }, () => created({ tenantId })),
      );
      for (const conversation of conversations) {
        await store.append(tenantId, conversation.id, [
          message('go'),
          message('next'),
          step(0, 0.5),
        ]);
      }
      const counted = countingDatabase(database);
      const counting = new PostgresConversationStore(counted.database);
      await Promise.all(
        conversations.map((conversation, i) =>
          counting.append(tenantId, conversation.id, [step(i % 2 === 0 ? 0 : 1, 0.25)]),
        ),
      );
      expect(counted.calls.statements).toBeLessThan(conversations.length / 2);
      for (const [i, conversation] of conversations.entries()) {
        expect((await store.getSnapshot(tenantId, conversation.id))?.conversation.turnCost).toEqual(
          i % 2 === 0 ? { cause: 0, costUsd: 0.75 } : { cause: 1, costUsd: 0.25 },
        );
      }
    });

    it('stores no temp: key in any state column', async () => {
      const tenantId = uniqueName('tenant');
      const conversation = await created({ tenantId });
      await store.append(tenantId, conversation.id, [
        message('one', {
          stateDelta: { kept: 1, 'user:name': 'Alice', 'app:motd': 'hi', 'temp:scratch': 'gone' },
        }),
      ]);
      const { rows } = await database.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM conversations, user_states, app_states
          WHERE conversations.tenant_id = $1
            AND (conversations.state::text LIKE '%scratch%'
                 OR user_states.state::text LIKE '%scratch%'
                 OR app_states.state::text LIKE '%scratch%')`,
        [tenantId],
      );
      expect(rows[0]!.n).toBe(0);
      expect((await store.getSnapshot(tenantId, conversation.id))?.state).toMatchObject({
        kept: 1,
      });
    });
  });

  describe('listConversations', () => {
    it("takes a new conversation's times from the write clock its activity times come from", async () => {
      // Activity order compares creation times with later append times: one
      // clock for both (the database's now() had microseconds the store's
      // clock, in whole milliseconds, could fall behind within one).
      const clocked = new PostgresConversationStore(database, {
        clock: new WriteClock(() => Date.parse('2026-01-02T03:04:05.678Z')),
      });
      const { conversation } = await clocked.createConversation(newConversation());
      expect(conversation.createdAt.toISOString()).toBe('2026-01-02T03:04:05.678Z');
      const { rows } = await database.query<{ created: string; updated: string }>(
        `SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created,
                to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS updated
           FROM conversations WHERE id = $1`,
        [conversation.id],
      );
      const at = '2026-01-02T03:04:05.678000Z';
      expect(rows[0]).toEqual({ created: at, updated: at });
    });

    it('keeps rows apart whose activity differs by microseconds', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = [];
      for (let i = 0; i < 6; i += 1) conversations.push(await created({ tenantId }));
      // Six rows within one millisecond, two of them at the very same instant.
      const micros = ['100', '101', '102', '102', '103', '104'];
      for (const [i, conversation] of conversations.entries()) {
        await database.query(
          `UPDATE conversations SET updated_at = timestamptz '2030-01-01 00:00:00.123' + $2::int * interval '1 microsecond'
            WHERE id = $1`,
          [conversation.id, Number(micros[i]) - 100],
        );
      }
      const seen: string[] = [];
      let cursor: string | undefined;
      do {
        const page = await store.listConversations(tenantId, {
          limit: 1,
          ...(cursor === undefined ? {} : { cursor }),
        });
        seen.push(...page.items.map((item) => item.id));
        cursor = page.nextCursor ?? undefined;
      } while (cursor !== undefined);
      expect(seen).toHaveLength(6);
      expect(new Set(seen).size).toBe(6);
      expect(seen[0]).toBe(conversations[5]!.id);
      const tied = [conversations[2]!.id, conversations[3]!.id].sort().reverse();
      expect(seen.slice(2, 4)).toEqual(tied);
      expect(seen[5]).toBe(conversations[0]!.id);
    });
  });

  it('lists the live conversations idle since before a time, in id order, by page', async () => {
    const live = [await created(), await created(), await created()];
    const [running] = live;
    const stopped = await created();
    const failed = await created();
    const fresh = await created();
    for (const { tenantId, id } of [running!, fresh])
      await store.setStatus(tenantId, id, 'RUNNING');
    for (const { tenantId, id } of live.slice(1)) await store.setStatus(tenantId, id, 'STARTING');
    await store.setStatus(failed.tenantId, failed.id, 'ERROR');
    const idle = [...live, stopped, failed].map((c) => c.id);
    await database.query(
      `UPDATE conversations SET updated_at = updated_at - interval '1 hour' WHERE id = ANY($1::uuid[])`,
      [idle],
    );
    const idleBefore = new Date(Date.now() - 60_000);
    const mine = new Set([...idle, fresh.id]);
    const found: string[] = [];
    const pages: number[] = [];
    for (let afterId: string | null = null; ;) {
      const page = await store.listLiveConversations({ idleBefore, afterId, limit: 2 });
      pages.push(page.length);
      found.push(...page.map((ref) => ref.conversationId).filter((id) => mine.has(id)));
      if (page.length < 2) break;
      afterId = page[page.length - 1]!.conversationId;
    }
    expect(found).toEqual(live.map((c) => c.id).sort());
    expect(pages.every((n) => n <= 2)).toBe(true);
    const ref = (
      await store.listLiveConversations({ idleBefore, afterId: null, limit: 1_000 })
    ).find((r) => r.conversationId === running!.id);
    expect(ref).toEqual({
      tenantId: running!.tenantId,
      userId: running!.userId,
      conversationId: running!.id,
      incarnation: running!.incarnation,
    });
    expect(await store.listLiveConversations({ idleBefore, afterId: 'nope', limit: 10 })).toEqual(
      [],
    );
  });
});

describe('appends on Postgres', () => {
  it("update the conversation's row in place (HOT): no index entry per append", async () => {
    const scratch = await createScratchDatabase('cs_hot');
    // One connection: the statistics read below are this backend's own.
    const database = openPostgres(scratch.url, { poolSize: 1 });
    try {
      await migrate(database);
      const store = new PostgresConversationStore(database);
      const { conversation } = await store.createConversation(newConversation());
      for (let i = 0; i < 50; i += 1) {
        await store.append(conversation.tenantId, conversation.id, [
          message(`m${i}`),
          agentStateChanged('running', { stateDelta: { turn: i } }),
        ]);
      }
      await database.query('SELECT pg_stat_force_next_flush()');
      const { rows } = await database.query<{ updates: number; hot: number }>(
        `SELECT n_tup_upd::int AS updates, n_tup_hot_upd::int AS hot
           FROM pg_stat_user_tables WHERE relname = 'conversations'`,
      );
      expect(rows[0]?.updates).toBe(50);
      // Page pruning makes room as it goes; a few may still move to another page.
      expect(rows[0]?.hot).toBeGreaterThanOrEqual(45);
    } finally {
      await database.close();
      await scratch.drop();
    }
  });
});

describe('migrate on Postgres', () => {
  it('applies each migration once when two migrators start at once', async () => {
    const scratch = await createScratchDatabase('cs_migrate');
    const first = openPostgres(scratch.url, { poolSize: 2 });
    const second = openPostgres(scratch.url, { poolSize: 2 });
    try {
      const [a, b] = await Promise.all([migrate(first), migrate(second)]);
      const all = (await loadMigrations()).map((m) => m.name);
      expect([...a, ...b].sort()).toEqual(all);
      const { rows } = await first.query<{ name: string }>('SELECT name FROM schema_migrations');
      expect(rows.map((row) => row.name).sort()).toEqual(all);
      expect(await migrate(second)).toEqual([]);
    } finally {
      await first.close();
      await second.close();
      await scratch.drop();
    }
  });

  it('applies each migration once when two migrators start at once through PgBouncer', async () => {
    const scratch = await createScratchDatabase('cs_migrate');
    const bouncer = await startPgBouncer();
    const url = bouncer.urlFor(scratch.url);
    const first = openPostgres(url, { poolSize: 2, preparedStatements: false });
    const second = openPostgres(url, { poolSize: 2, preparedStatements: false });
    try {
      const [a, b] = await Promise.all([migrate(first), migrate(second)]);
      const all = (await loadMigrations()).map((m) => m.name);
      expect([...a, ...b].sort()).toEqual(all);
      const { rows } = await first.query<{ name: string }>('SELECT name FROM schema_migrations');
      expect(rows.map((row) => row.name).sort()).toEqual(all);
    } finally {
      await first.close();
      await second.close();
      await bouncer.stop();
      await scratch.drop();
    }
  });

  it('refuses a migration changed after it was applied', async () => {
    const scratch = await createScratchDatabase('cs_migrate');
    const database = openPostgres(scratch.url, { poolSize: 1 });
    try {
      const migrations = await loadMigrations();
      await migrate(database, migrations);
      const edited = migrations.map((m, i) => (i === 0 ? { ...m, checksum: 'edited' } : m));
      await expect(migrate(database, edited)).rejects.toThrow(/changed after it was applied/);
    } finally {
      await database.close();
      await scratch.drop();
    }
  });
});

describe('the embedded database in DATA_DIR', () => {
  const dirs: string[] = [];
  const scratchDir = () => {
    const dir = mkdtempSync(join(tmpdir(), 'cs-store-'));
    dirs.push(dir);
    return dir;
  };

  afterAll(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it('refuses a second opener while the first keeps serving, and reopens after close', async () => {
    const dataDir = scratchDir();
    const first = await openStore({ dataDir, migrate: true });
    const input = newConversation();
    try {
      expect(first.migrationsApplied).toEqual((await loadMigrations()).map((m) => m.name));
      await first.store.createConversation(input);
      await first.store.append(input.tenantId, input.id, [message('before')]);

      const second = openStore({ dataDir, migrate: true });
      await expect(second).rejects.toBeInstanceOf(DataDirLockedError);
      await expect(second).rejects.toThrow(/another process .*uses the data folder/);
      await expect(second).rejects.toThrow(dataDir);
      await expect(openEmbeddedDatabase(dataDir)).rejects.toBeInstanceOf(DataDirLockedError);

      await first.store.append(input.tenantId, input.id, [message('after')]);
    } finally {
      await first.close();
    }

    const reopened = await openStore({ dataDir, migrate: true });
    try {
      expect(reopened.migrationsApplied).toEqual([]);
      const events = await reopened.store.readEvents(input.tenantId, input.id, { limit: 10 });
      expect(events.map((event) => event.id)).toEqual([0, 1]);
    } finally {
      await reopened.close();
    }
    // Opening a new data folder takes seconds of WebAssembly start-up, twice here.
  }, 180_000);

  it('takes over the lock of a process that died', async () => {
    const dataDir = scratchDir();
    const dead = spawnSync(process.execPath, ['-e', '']).pid;
    abandonLock(dataDir, dead);
    const lock = await lockDataDir(dataDir);
    expect(JSON.parse(readFileSync(join(dataDir, 'lock-owner.json'), 'utf8'))).toMatchObject({
      pid: process.pid,
    });
    await lock.release();
  });

  it('takes over the lock of a zombie process', async () => {
    const dataDir = scratchDir();
    // A parent that never waits for its child: the child stays a zombie until the parent dies.
    const holder = spawn(
      'python3',
      [
        '-c',
        'import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(30)',
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    try {
      const [line] = (await once(holder.stdout, 'data')) as [Buffer];
      const zombie = Number(line.toString().trim());
      await expect.poll(() => procState(zombie)).toBe('Z');
      abandonLock(dataDir, zombie);
      const lock = await lockDataDir(dataDir);
      await lock.release();
    } finally {
      holder.kill('SIGKILL');
    }
  });

  it('leaves the lock of a live process alone', async () => {
    const dataDir = scratchDir();
    // Our parent is alive (vitest's main process).
    abandonLock(dataDir, process.ppid);
    const attempt = lockDataDir(dataDir);
    await expect(attempt).rejects.toBeInstanceOf(DataDirLockedError);
    await expect(attempt).rejects.toMatchObject({ ownerPid: process.ppid });
  });
});

/** What a holder that died without releasing leaves behind. */
function abandonLock(dataDir: string, pid: number | undefined): void {
  mkdirSync(join(dataDir, 'lock'));
  writeFileSync(join(dataDir, 'lock-owner.json'), JSON.stringify({ pid, hostname: hostname() }));
}

function procState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
}
