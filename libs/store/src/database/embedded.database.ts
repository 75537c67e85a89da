/**
 * The embedded database of the standalone mode: PGlite in `<DATA_DIR>/pgdata`,
 * the folder locked to this process while it is open.
 */
import { join } from 'node:path';
import type { DataDirLockOptions } from './data-dir.lock.js';
import { lockDataDir } from './data-dir.lock.js';
import { openPglite } from './pglite.database.js';
import type { SqlDatabase } from './sql-database.js';

/** Throws `DataDirLockedError` when another process uses `dataDir`. */
export async function openEmbeddedDatabase(
  dataDir: string,
  options: DataDirLockOptions = {},
): Promise<SqlDatabase> {
  const lock = await lockDataDir(dataDir, options);
  try {
    return await openPglite(join(lock.dataDir, 'pgdata'), { onClose: () => lock.release() });
  } catch (error) {
    await lock.release();
    throw error;
  }
}
