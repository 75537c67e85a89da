// A Postgres database and a PGlite folder holding every migration, made once
// per set of migration files (named by their hash) by the global setup
// (test/global-setup.ts), and copied for the end-to-end files' databases (by
// CREATE DATABASE … TEMPLATE) and standalone DATA_DIRs: their processes then
// start on a migrated schema instead of each running every migration again
// (and PGlite's initdb). Without them a database or folder starts empty and
// the processes migrate it, as in production. The integration specs start
// their databases from the same templates where they do not test migrating
// (`createScratchDatabase(…, { migrated: true })`, `openMigratedPglite()`).
import { createHash } from 'node:crypto';
import {
  cpSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { migrate, openPglite, openPostgres, type SqlDatabase } from '@cs/store';

const MIGRATIONS = fileURLToPath(new URL('../../libs/store/src/migrations/', import.meta.url));
const PREFIX = 'cs_template_';

/** The template's name: a hash of the migration files, so a changed migration makes a new one. */
export function migratedTemplateName(): string {
  if (templateName) return templateName;
  const hash = createHash('sha256');
  for (const file of readdirSync(MIGRATIONS)
    .filter((f) => f.endsWith('.sql'))
    .sort()) {
    hash.update(file).update(readFileSync(MIGRATIONS + file));
  }
  templateName = PREFIX + hash.digest('hex').slice(0, 16);
  return templateName;
}
let templateName: string | undefined;

/** Whether the template of today's migrations exists on the server `client` is connected to. */
export async function migratedTemplateExists(client: pg.Client): Promise<boolean> {
  const { rows } = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [
    migratedTemplateName(),
  ]);
  return rows.length > 0;
}

/**
 * Makes the template of today's migrations unless it exists: migrated under
 * a name of its own, then renamed (atomic, so two setups at once both end
 * with one whole template). Templates of other migrations are left alone: a
 * run on another checkout may be copying one.
 */
export async function ensureMigratedTemplate(adminUrl: string): Promise<void> {
  const name = migratedTemplateName();
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    if (await migratedTemplateExists(admin)) return;
    const building = `${name}_${process.pid}_${Date.now().toString(36)}`;
    await admin.query(`CREATE DATABASE "${building}"`);
    const url = new URL(adminUrl);
    url.pathname = `/${building}`;
    const database = openPostgres(url.toString(), { poolSize: 1 });
    try {
      await migrate(database);
    } finally {
      await database.close();
    }
    try {
      await admin.query(`ALTER DATABASE "${building}" RENAME TO "${name}"`);
    } catch {
      // Another setup made it meanwhile.
      await admin.query(`DROP DATABASE IF EXISTS "${building}" WITH (FORCE)`);
    }
  } finally {
    await admin.end();
  }
}

/** Where the migrated PGlite folder of today's migrations is kept (beside the temporary folders). */
function pgliteTemplateDir(): string {
  return join(tmpdir(), `cs-pglite-template-${migratedTemplateName().slice(PREFIX.length)}`);
}

/**
 * Makes the migrated PGlite folder unless it exists (a new PGlite folder
 * costs seconds of initdb, a copy milliseconds): built under a name of its
 * own, then renamed.
 */
export async function ensurePgliteTemplate(): Promise<void> {
  const target = pgliteTemplateDir();
  if (!existsSync(target)) await buildPgliteTemplate(target);
  await ensurePgliteDump(target);
}

async function buildPgliteTemplate(target: string): Promise<void> {
  const building = `${target}-${process.pid}-${Date.now().toString(36)}`;
  const database = await openPglite(join(building, 'pgdata'));
  try {
    await migrate(database);
  } finally {
    await database.close();
  }
  try {
    renameSync(building, target);
  } catch {
    // Another setup made it meanwhile.
    rmSync(building, { recursive: true, force: true });
  }
}

/** The migrated PGlite folder as one tarball (PGlite's `dumpDataDir`), for in-memory databases. */
function pgliteDumpFile(): string {
  return `${pgliteTemplateDir()}.tar`;
}

/**
 * Makes the tarball of the migrated folder unless it exists: dumped from a
 * copy (the folder itself may be being copied by another run), written under
 * a name of its own, then renamed.
 */
async function ensurePgliteDump(template: string): Promise<void> {
  const target = pgliteDumpFile();
  if (existsSync(target)) return;
  const building = `${target}-${process.pid}-${Date.now().toString(36)}`;
  cpSync(join(template, 'pgdata'), join(building, 'pgdata'), { recursive: true });
  try {
    const db = await PGlite.create({ dataDir: join(building, 'pgdata') });
    try {
      const dump = await db.dumpDataDir('none');
      writeFileSync(`${building}.tar`, Buffer.from(await dump.arrayBuffer()));
    } finally {
      await db.close();
    }
    renameSync(`${building}.tar`, target);
  } finally {
    rmSync(building, { recursive: true, force: true });
    rmSync(`${building}.tar`, { force: true });
  }
}

/**
 * A new in-memory PGlite, migrated: a copy of the migrated template when the
 * global setup made it (a load of its tarball instead of initdb and every
 * migration), else empty, for the caller's `migrate()` to fill.
 */
export async function openMigratedPglite(): Promise<SqlDatabase> {
  const dump = pgliteDumpFile();
  if (!existsSync(dump)) return openPglite(undefined);
  pgliteDump ??= new Blob([readFileSync(dump)]);
  return openPglite(undefined, { loadDataDir: pgliteDump });
}
let pgliteDump: Blob | undefined;

/**
 * A new DATA_DIR for a standalone process on PGlite: its `pgdata` a copy of
 * the migrated PGlite folder when the global setup made it (else empty, for
 * the process to create and migrate). The caller removes it.
 */
export function standaloneDataDir(prefix = 'cs-e2e-'): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const template = pgliteTemplateDir();
  if (existsSync(template))
    cpSync(join(template, 'pgdata'), join(dir, 'pgdata'), { recursive: true });
  return dir;
}
