/**
 * One process per embedded database folder. PGlite lets two processes open the
 * same folder and silently loses one's writes, so the folder is locked with
 * proper-lockfile (an atomic mkdir whose mtime the holder keeps fresh). A
 * crashed holder's lock is taken over at once when its pid is gone (zombies
 * count as gone: PID 1 here does not reap orphans), else once it goes stale.
 */
import { chmodSync, mkdirSync, readFileSync } from 'node:fs';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import lockfile from 'proper-lockfile';

/** Another live process holds the data folder. */
export class DataDirLockedError extends Error {
  constructor(
    readonly dataDir: string,
    readonly ownerPid: number | undefined,
  ) {
    super(
      `another process${ownerPid === undefined ? '' : ` (pid ${ownerPid})`} uses the data folder ` +
        `${dataDir}: stop it, or set DATA_DIR to another folder`,
    );
    this.name = 'DataDirLockedError';
  }
}

export interface DataDirLock {
  readonly dataDir: string;
  release(): Promise<void>;
}

export interface DataDirLockOptions {
  /**
   * Called when the lock could not be kept fresh or was taken by another
   * process: this process must stop writing. proper-lockfile's default throws,
   * which ends the process.
   */
  onCompromised?: (error: Error) => void;
}

interface LockOwner {
  pid: number;
  hostname: string;
}

// Long enough that a busy event loop (PGlite's start blocks it for seconds)
// never lets the lock look abandoned; a crash is detected by pid instead.
const STALE_MS = 30_000;
const LOCK_NAME = 'lock';
const OWNER_NAME = 'lock-owner.json';

/** Only the owner may list, read or write the data folder (PGlite's own files are 0666). */
export const DATA_DIR_MODE = 0o700;

/**
 * Makes the folder if it is missing and sets it to `DATA_DIR_MODE` either
 * way: mkdir's mode only applies to a folder it creates, and through the
 * umask, so a folder that existed with another mode would keep it.
 */
export function makePrivateDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: DATA_DIR_MODE });
  chmodSync(dir, DATA_DIR_MODE);
}

export async function lockDataDir(
  dataDir: string,
  options: DataDirLockOptions = {},
): Promise<DataDirLock> {
  const dir = resolve(dataDir);
  makePrivateDir(dir);
  const lockfilePath = join(dir, LOCK_NAME);
  const ownerPath = join(dir, OWNER_NAME);
  const lockOptions = {
    lockfilePath,
    stale: STALE_MS,
    realpath: false,
    ...(options.onCompromised ? { onCompromised: options.onCompromised } : {}),
  };

  let unlock: () => Promise<void>;
  try {
    unlock = await lockfile.lock(dir, lockOptions);
  } catch (error) {
    if (!isLockedError(error)) throw error;
    const owner = await readOwner(ownerPath);
    if (owner === undefined || !isDead(owner)) throw new DataDirLockedError(dir, owner?.pid);
    await rm(lockfilePath, { recursive: true, force: true });
    try {
      unlock = await lockfile.lock(dir, lockOptions);
    } catch (retryError) {
      // Another process took the abandoned lock first.
      if (isLockedError(retryError)) throw new DataDirLockedError(dir, undefined);
      throw retryError;
    }
  }

  const owner: LockOwner = { pid: process.pid, hostname: hostname() };
  await writeFile(ownerPath, JSON.stringify(owner));
  let released = false;
  return {
    dataDir: dir,
    async release() {
      if (released) return;
      released = true;
      // The owner file goes first: once the lock is free, it is the next holder's.
      await rm(ownerPath, { force: true });
      await unlock();
    },
  };
}

function isLockedError(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 'ELOCKED';
}

async function readOwner(path: string): Promise<LockOwner | undefined> {
  try {
    const parsed = JSON.parse(await readFile(path, 'utf8')) as Partial<LockOwner>;
    if (typeof parsed.pid !== 'number' || typeof parsed.hostname !== 'string') return undefined;
    return { pid: parsed.pid, hostname: parsed.hostname };
  } catch {
    return undefined;
  }
}

/** Only a process on this host can be checked; pids of other hosts mean nothing here. */
function isDead(owner: LockOwner): boolean {
  if (owner.hostname !== hostname() || owner.pid === process.pid) return false;
  try {
    process.kill(owner.pid, 0);
  } catch (error) {
    return (error as { code?: unknown }).code === 'ESRCH';
  }
  return isZombie(owner.pid);
}

function isZombie(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The state follows the command name, which is in parentheses and may hold spaces.
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) === 'Z';
  } catch {
    return false;
  }
}
