// Checks once, before any test, that the Postgres and Redis the suite needs are
// reachable, and says how to provide them when they are not; then makes the
// migrated templates the end-to-end files' databases are copied from.
import pg from 'pg';
import { Redis } from 'ioredis';
import { ensureMigratedTemplate, ensurePgliteTemplate } from './support/migrated-template.js';
import { testDatabaseUrl, testRedisUrl } from './support/services.js';

export default async function checkServices(): Promise<void> {
  const problems: string[] = [];
  const client = new pg.Client({
    connectionString: testDatabaseUrl(),
    connectionTimeoutMillis: 5000,
  });
  try {
    await client.connect();
    await client.query('select 1');
  } catch (error) {
    problems.push(
      `Postgres is not reachable at ${redact(testDatabaseUrl())} (${String(error)}).\n` +
        '  Start it, or set DATABASE_URL to a server where this user may CREATE DATABASE.',
    );
  } finally {
    await client.end().catch(() => undefined);
  }
  const redis = new Redis(testRedisUrl(), {
    lazyConnect: true,
    maxRetriesPerRequest: 1,
    retryStrategy: () => null,
  });
  try {
    await redis.connect();
    await redis.ping();
  } catch (error) {
    problems.push(
      `Redis is not reachable at ${redact(testRedisUrl())} (${String(error)}).\n` +
        '  Start it (redis-server --port 6379), or set REDIS_URL.',
    );
  } finally {
    redis.disconnect();
  }
  if (problems.length > 0) {
    throw new Error(`the test suite needs Postgres and Redis:\n${problems.join('\n')}`);
  }
  await ensureMigratedTemplate(testDatabaseUrl());
  await ensurePgliteTemplate();
}

function redact(url: string): string {
  return url.replace(/\/\/[^@/]*@/, '//***@');
}
