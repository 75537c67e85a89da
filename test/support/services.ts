// Where the tests find Postgres and Redis: DATABASE_URL / REDIS_URL, with the
// defaults of docs/protocol.md. Each test file makes its own database.
import { randomBytes, randomUUID } from 'node:crypto';
import { refOf, type ConversationRef, type ConversationStore } from '@cs/core';
import calculateSlot from 'cluster-key-slot';
import type { Redis } from 'ioredis';
import pg from 'pg';
import { migratedTemplateExists, migratedTemplateName } from './migrated-template.js';

export function testDatabaseUrl(): string {
  return process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
}

export function testRedisUrl(): string {
  return process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
}

/** A unique name for per-test resources (databases, key prefixes, tenants). */
export function uniqueName(prefix: string): string {
  return `${prefix}_${Date.now().toString(36)}_${randomBytes(4).toString('hex')}`;
}

export interface ScratchDatabase {
  url: string;
  name: string;
  drop(): Promise<void>;
}

/**
 * Creates a database for one test file; `drop()` removes it. Empty, or with
 * `migrated` a copy of the migrated template when the global setup made it
 * (test/support/migrated-template.ts; else empty, for the processes to migrate).
 */
export async function createScratchDatabase(
  prefix = 'cs_test',
  options: { migrated?: boolean } = {},
): Promise<ScratchDatabase> {
  const admin = testDatabaseUrl();
  const name = uniqueName(prefix).toLowerCase();
  const client = new pg.Client({ connectionString: admin });
  await client.connect();
  try {
    const template =
      options.migrated && (await migratedTemplateExists(client))
        ? ` TEMPLATE "${migratedTemplateName()}"`
        : '';
    await client.query(`CREATE DATABASE "${name}"${template}`);
  } finally {
    await client.end();
  }
  const url = new URL(admin);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    name,
    async drop() {
      const dropper = new pg.Client({ connectionString: admin });
      await dropper.connect();
      try {
        await dropper.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
      } finally {
        await dropper.end();
      }
    },
  };
}

/**
 * Removes every key under `<prefix>:` from the shared Redis (tests leave
 * nothing behind). `bySlot`: `redis` is one master of a Redis Cluster, whose
 * UNLINK takes keys of one slot.
 */
export async function deleteKeys(redis: Redis, prefix: string, bySlot = false): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length === 0) continue;
    if (!bySlot) {
      await redis.unlink(...keys);
      continue;
    }
    const slots = new Map<number, string[]>();
    for (const key of keys)
      slots.set(calculateSlot(key), [...(slots.get(calculateSlot(key)) ?? []), key]);
    for (const group of slots.values()) await redis.unlink(...group);
  } while (cursor !== '0');
}

/** A new conversation of `owner` run by the echo agent, straight in the store. */
export async function createEchoConversation(
  store: ConversationStore,
  owner: { tenantId: string; userId: string },
  title = 'a test conversation',
): Promise<ConversationRef> {
  const { conversation } = await store.createConversation({
    id: randomUUID(),
    tenantId: owner.tenantId,
    userId: owner.userId,
    appName: 'test',
    title,
    metadata: {},
    agent: { name: 'echo', config: {} },
    instructions: null,
  });
  return refOf(conversation);
}
