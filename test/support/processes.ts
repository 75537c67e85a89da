// Spawns the built apps (dist/) as real processes for end-to-end tests, waits
// for them to be healthy, and stops them. Output is kept for failure messages.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../bench/lib/ports.mjs';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export type AppName = 'standalone' | 'gateway' | 'worker';

export interface AppProcess {
  name: string;
  url: string;
  port: number;
  child: ChildProcess;
  output(): string;
  /** Resolves with the exit code (or signal) once the process has exited. */
  exited: Promise<number | string>;
  signal(signal: NodeJS.Signals): void;
  stop(): Promise<number | string>;
}

export { freePort };

/** Starts of an app whose port another process took between its pick and its bind. */
const PORT_ATTEMPTS = 3;

export async function startApp(
  app: AppName,
  env: Record<string, string>,
  options: {
    name?: string;
    healthPath?: string;
    portVar?: string;
    timeoutMs?: number;
    /** Node options before the entry point (`--import` of the tracing hook, as the start scripts). */
    nodeArgs?: string[];
  } = {},
): Promise<AppProcess> {
  const portVar = options.portVar ?? (app === 'worker' ? 'WORKER_HTTP_PORT' : 'PORT');
  // A port the test chose is used as it is; one picked here is picked again when
  // another process (a file beside this one) bound it first.
  const chosen = env[portVar] ? Number(env[portVar]) : undefined;
  for (let attempt = 1; ; attempt += 1) {
    const { proc, closed } = spawnApp(app, env, options, portVar, chosen ?? (await freePort()));
    try {
      await waitForHealthy(proc, options.healthPath ?? '/healthz', options.timeoutMs ?? 60_000);
      return proc;
    } catch (error) {
      if (chosen !== undefined || attempt === PORT_ATTEMPTS || proc.child.exitCode === null) {
        throw error;
      }
      // Its last lines may still be in the pipes when it exits.
      await closed;
      if (!/EADDRINUSE/.test(proc.output())) throw error;
    }
  }
}

function spawnApp(
  app: AppName,
  env: Record<string, string>,
  options: { name?: string; nodeArgs?: string[] },
  portVar: string,
  port: number,
): { proc: AppProcess; closed: Promise<void> } {
  const child = spawn(
    process.execPath,
    [...(options.nodeArgs ?? []), `dist/apps/${app}/src/main.js`],
    {
      cwd: ROOT,
      env: { ...process.env, LOG_LEVEL: 'warn', ...env, [portVar]: String(port) },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let output = '';
  child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<number | string>((resolve) =>
    child.on('exit', (code, signal) => resolve(code ?? signal ?? -1)),
  );
  const closed = new Promise<void>((resolve) => child.on('close', () => resolve()));
  const proc: AppProcess = {
    name: options.name ?? app,
    url: `http://127.0.0.1:${port}`,
    port,
    child,
    output: () => output,
    exited,
    signal: (signal) => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    },
    async stop() {
      proc.signal('SIGTERM');
      const timer = setTimeout(() => proc.signal('SIGKILL'), 15_000);
      const result = await exited;
      clearTimeout(timer);
      return result;
    },
  };
  return { proc, closed };
}

async function waitForHealthy(proc: AppProcess, path: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let exitedWith: number | string | undefined;
  void proc.exited.then((code) => (exitedWith = code));
  while (Date.now() < deadline) {
    if (exitedWith !== undefined) {
      throw new Error(
        `${proc.name} exited (${exitedWith}) before it was healthy:\n${proc.output()}`,
      );
    }
    try {
      // Bounded: what holds the port may not be an HTTP server that answers.
      const response = await fetch(proc.url + path, { signal: AbortSignal.timeout(2_000) });
      // Another file's process may have bound the port between its pick and
      // this one's listen, and answer for it while this one exits with
      // EADDRINUSE: only this process' own answer counts.
      if (response.ok && listensOn(proc.child.pid, proc.port)) return;
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  proc.signal('SIGKILL');
  throw new Error(`${proc.name} was not healthy within ${timeoutMs} ms:\n${proc.output()}`);
}

/**
 * Whether process `pid` holds the listening TCP socket of `port` (Linux: the
 * socket's inode in /proc/net/tcp{,6} among the process' descriptors).
 */
export function listensOn(pid: number | undefined, port: number): boolean {
  if (pid === undefined) return false;
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  const inodes = new Set<string>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      // local_address is <ip>:<port>, st 0A is LISTEN, field 9 the inode
      if (fields[1]?.endsWith(`:${hexPort}`) && fields[3] === '0A') inodes.add(fields[9]!);
    }
  }
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return false;
  }
  return fds.some((fd) => {
    try {
      const inode = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1];
      return inode !== undefined && inodes.has(inode);
    } catch {
      return false;
    }
  });
}
