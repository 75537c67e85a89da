// A private redis-server for tests that restart Redis: its own free port and
// temporary data folder (append-only file on), so that a restart on the same
// port and folder brings every key back, as a production Redis would.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './processes.js';
import { waitForNode } from './redis-cluster.js';

export interface PrivateRedis {
  url: string;
  port: number;
  dir: string;
  /**
   * SIGTERM (Redis writes its append-only file and exits), wait for the exit,
   * stay down for `downMs` (or until `down()` settles: an outage that lasts
   * until the test has seen what it waits for), start again.
   */
  restart(down?: number | (() => Promise<unknown>)): Promise<void>;
  /** Stops the server and removes its folder. */
  stop(): Promise<void>;
}

/** Starts of a server whose port another process took between its pick and its bind. */
const PORT_ATTEMPTS = 3;

export async function startPrivateRedis(): Promise<PrivateRedis> {
  const dir = mkdtempSync(join(tmpdir(), 'cs-redis-'));
  const started = await launchOnFreePort(dir).catch((error: unknown) => {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  });
  const { port } = started;
  let { child } = started;
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    dir,
    async restart(down = 0) {
      await terminate(child);
      if (typeof down === 'number') await new Promise((resolve) => setTimeout(resolve, down));
      else await down().catch(() => undefined);
      child = await launch(port, dir);
    },
    async stop() {
      await terminate(child);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function launchOnFreePort(dir: string): Promise<{ port: number; child: ChildProcess }> {
  for (let attempt = 1; ; attempt += 1) {
    const port = await freePort();
    try {
      return { port, child: await launch(port, dir) };
    } catch (error) {
      if (attempt === PORT_ATTEMPTS) throw error;
    }
  }
}

async function launch(port: number, dir: string): Promise<ChildProcess> {
  const child = spawn(
    'redis-server',
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--dir',
      dir,
      '--appendonly',
      'yes',
      '--save',
      '',
      '--logfile',
      '',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  try {
    // Not another server that took the port before this one could bind it.
    await waitForNode(port, 10_000, child);
    return child;
  } catch (error) {
    child.kill('SIGKILL');
    const why = error instanceof Error ? error.message : String(error);
    throw new Error(`redis-server on port ${port} did not start (${why}):\n${output}`, {
      cause: error,
    });
  }
}

async function terminate(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}
