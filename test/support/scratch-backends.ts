// A test file's own Postgres and Redis for integration specs: a scratch
// database with the store migrated on it, Redis connections (one for
// commands, more on demand), and a key prefix no other test uses. close()
// leaves nothing behind: the keys, the connections, the store, the database.
import type { Redis } from 'ioredis';
import { ClusterKeys, openRedis } from '@cs/cluster';
import { openStore, type OpenedStore } from '@cs/store';
import {
  createScratchDatabase,
  deleteKeys,
  testRedisUrl,
  uniqueName,
  type ScratchDatabase,
} from './services.js';

export interface ScratchBackends {
  scratch: ScratchDatabase;
  opened: OpenedStore;
  keys: ClusterKeys;
  /** The connection for commands, named `<connectionName>`. */
  redis: Redis;
  /** Another connection (a subscriber, BullMQ's), named `<connectionName>-<role>`. */
  connect(role: string): Redis;
  /** Removes every key under the prefix (between tests). */
  deleteKeys(): Promise<void>;
  close(): Promise<void>;
}

/** Opens the database `<name>_…` and the key prefix `<name>_…`. */
export async function openScratchBackends(
  name: string,
  connectionName: string,
): Promise<ScratchBackends> {
  const scratch = await createScratchDatabase(name);
  const connections: Redis[] = [];
  let opened: OpenedStore | undefined;
  const close = async () => {
    for (const connection of connections) connection.disconnect();
    await opened?.close();
    await scratch.drop();
  };
  try {
    opened = await openStore({ databaseUrl: scratch.url, dataDir: '', migrate: true });
  } catch (error) {
    await close();
    throw error;
  }
  const keys = new ClusterKeys(uniqueName(name));
  const open = (connectionName: string) => {
    const connection = openRedis(testRedisUrl(), connectionName);
    connections.push(connection);
    return connection;
  };
  const redis = open(connectionName);
  return {
    scratch,
    opened,
    keys,
    redis,
    connect: (role) => open(`${connectionName}-${role}`),
    deleteKeys: () => deleteKeys(redis, keys.prefix),
    async close() {
      await deleteKeys(redis, keys.prefix);
      await close();
    },
  };
}
