// Starting and stopping the cluster's processes for the chaos run: gateways,
// workers and a private redis-server, each restartable on the same port.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT, sleep } from '../bench/lib/cluster.mjs';
import { freePort } from '../bench/lib/ports.mjs';

export { freePort, sleep };

async function waitFor(check, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

/** A process that can be killed, paused and started again with the same settings. */
export class ManagedProcess {
  constructor({ name, command, args, env, healthUrl, log }) {
    Object.assign(this, { name, command, args, env, healthUrl, log });
    this.child = null;
    this.stopped = false;
  }

  get pid() {
    return this.child?.pid;
  }

  get running() {
    return this.child !== null && this.child.exitCode === null && this.child.signalCode === null;
  }

  async start() {
    const env = { ...process.env, ...this.env };
    // `undefined`: unset (e.g. REDIS_URL of the caller's environment on a Redis Cluster).
    for (const [key, value] of Object.entries(env)) if (value === undefined) delete env[key];
    const child = spawn(this.command, this.args, {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child = child;
    this.exited = new Promise((resolve) =>
      child.on('exit', (code, signal) => resolve(code ?? signal)),
    );
    const prefix = `[${this.name}] `;
    const forward = (chunk) => {
      for (const line of chunk.toString().split('\n')) if (line.trim()) this.log?.(prefix + line);
    };
    child.stdout.on('data', forward);
    child.stderr.on('data', forward);
    if (this.healthUrl) {
      await waitFor(async () => (await fetch(this.healthUrl)).ok, 60_000, `${this.name} healthy`);
    }
  }

  signal(signal) {
    if (this.running) this.child.kill(signal);
  }

  async kill(signal = 'SIGKILL', timeoutMs = 35_000) {
    if (!this.running) return;
    const exited = this.exited;
    this.child.kill(signal);
    const timer = setTimeout(() => this.child?.kill('SIGKILL'), timeoutMs);
    await exited;
    clearTimeout(timer);
  }
}

/**
 * A private redis-server (append-only file on, like a production Redis for
 * BullMQ; `durable: false`: off, like the benchmark's Redis Cluster nodes).
 */
export async function redisServer(log, { durable = true } = {}) {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'cs-chaos-redis-'));
  const proc = new ManagedProcess({
    name: 'redis',
    command: 'redis-server',
    args: [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--dir',
      dir,
      ...(durable ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no']),
      '--save',
      '',
      '--maxmemory-policy',
      'noeviction',
    ],
    env: {},
    log,
  });
  proc.url = `redis://127.0.0.1:${port}`;
  proc.port = port;
  proc.cleanup = () => rmSync(dir, { recursive: true, force: true });
  await proc.start();
  await waitFor(
    async () => {
      const { Redis } = await import('ioredis');
      const client = new Redis(proc.url, {
        lazyConnect: true,
        retryStrategy: () => null,
        maxRetriesPerRequest: 0,
      });
      client.on('error', () => undefined); // not up yet: the next attempt tells
      try {
        await client.connect();
        return (await client.ping()) === 'PONG';
      } finally {
        client.disconnect();
      }
    },
    10_000,
    'redis',
  );
  return proc;
}

export function appProcess(app, name, env, port, log) {
  const healthPort = app === 'worker' ? env.WORKER_HTTP_PORT : env.PORT;
  return new ManagedProcess({
    name,
    command: process.execPath,
    args: [`dist/apps/${app}/src/main.js`],
    env,
    healthUrl: `http://127.0.0.1:${healthPort}/healthz`,
    log,
  });
}
