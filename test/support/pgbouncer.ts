// A private PgBouncer (Debian's `pgbouncer`, 1.18: `.ci/run` installs it) in
// transaction mode in front of the tests' Postgres, on a free port, with
// trust authentication: every database of that Postgres is reachable through
// it by the same name (`urlFor`). As root it runs as the `postgres` user
// (PgBouncer refuses root). It cannot keep prepared statements in this mode,
// so clients use DATABASE_PREPARED_STATEMENTS=false / `preparedStatements: false`.
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from './processes.js';
import { testDatabaseUrl } from './services.js';

export interface PrivatePgBouncer {
  port: number;
  /** `url` (a database URL of the tests' Postgres) with PgBouncer's host and port instead. */
  urlFor(url: string): string;
  /** Stops PgBouncer and removes its folder. */
  stop(): Promise<void>;
}

/** Server connections PgBouncer opens per database and user; clients beyond them wait. */
const POOL_SIZE = 40;

/** Starts of a PgBouncer whose port another process took between its pick and its bind. */
const PORT_ATTEMPTS = 3;

export async function startPgBouncer(): Promise<PrivatePgBouncer> {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await startPgBouncerOn(await freePort());
    } catch (error) {
      if (attempt === PORT_ATTEMPTS) throw error;
    }
  }
}

/** A PgBouncer on `port`; refused when the port is taken, by another PgBouncer too. */
export async function startPgBouncerOn(port: number): Promise<PrivatePgBouncer> {
  const upstream = new URL(testDatabaseUrl());
  const dir = mkdtempSync(join(tmpdir(), 'cs-pgbouncer-'));
  // Readable by the user PgBouncer runs as.
  chmodSync(dir, 0o755);
  const user = decodeURIComponent(upstream.username || 'postgres');
  const userlist = join(dir, 'userlist.txt');
  writeFileSync(userlist, `"${user}" ""\n`, { mode: 0o644 });
  const config = join(dir, 'pgbouncer.ini');
  writeFileSync(
    config,
    [
      '[databases]',
      // Every database name goes to the same server, under that name.
      `* = host=${upstream.hostname} port=${upstream.port || '5432'}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${userlist}`,
      // Its admin console tells this PgBouncer from another on the port (answeredByUs).
      `admin_users = ${user}`,
      'pool_mode = transaction',
      `default_pool_size = ${POOL_SIZE}`,
      'max_client_conn = 1000',
      'max_db_connections = 0',
      // Sent by some clients at connect; PgBouncer refuses unknown ones otherwise.
      'ignore_startup_parameters = extra_float_digits,options',
      'server_lifetime = 3600',
      'log_connections = 0',
      'log_disconnections = 0',
      '',
    ].join('\n'),
    { mode: 0o644 },
  );
  const asRoot = userInfo().uid === 0;
  // Debian puts it in /usr/sbin, which a non-root PATH may lack.
  const binary = existsSync('/usr/sbin/pgbouncer') ? '/usr/sbin/pgbouncer' : 'pgbouncer';
  const child = spawn(binary, [...(asRoot ? ['-u', 'postgres'] : []), config], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const spawned = new Promise<Error | null>((resolve) => {
    child.once('spawn', () => resolve(null));
    child.once('error', resolve);
  });
  const failure = await spawned;
  if (failure) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`pgbouncer could not start (${failure.message}): is it installed?`);
  }

  const urlFor = (url: string) => {
    const through = new URL(url);
    through.hostname = '127.0.0.1';
    through.port = String(port);
    return through.toString();
  };
  const stop = async () => {
    await terminate(child);
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) break;
    if (await answers(urlFor(upstream.toString()))) {
      if (await answeredByUs(port, userlist)) return { port, urlFor, stop };
      break; // another PgBouncer took the port before this one could bind it
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await stop();
  throw new Error(`pgbouncer on port ${port} did not start:\n${output}`);
}

async function answers(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Whether the PgBouncer on `port` is the one configured with `authFile`, not another run's. */
async function answeredByUs(port: number, authFile: string): Promise<boolean> {
  const admin = new pg.Client({
    host: '127.0.0.1',
    port,
    database: 'pgbouncer',
    user: decodeURIComponent(new URL(testDatabaseUrl()).username || 'postgres'),
  });
  admin.on('error', () => undefined);
  try {
    await admin.connect();
    // The admin console speaks the simple query protocol only.
    const { rows } = await admin.query<{ key: string; value: string }>({
      text: 'SHOW CONFIG',
      queryMode: 'simple',
    } as pg.QueryConfig);
    return rows.some((row) => row.key === 'auth_file' && row.value === authFile);
  } catch {
    return false;
  } finally {
    await admin.end().catch(() => undefined);
  }
}

async function terminate(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  // SIGINT: PgBouncer's "safe shutdown" waits for clients; SIGTERM closes at once.
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}
