// `--profile`: the services run with `--cpu-prof`; each writes a V8 CPU
// profile when it exits. This prints where each process spent its CPU (self
// time by package or file, then by function); open a profile in Chrome
// DevTools for the whole picture.
//
// Read the system calls' shares with care. V8 samples on a wall-clock timer,
// so a thread that another process preempted inside a system call is counted
// as busy in that call: a socket write that wakes its reader (Postgres, Redis,
// a client) on the same core often is. On a saturated 2-core machine the
// profiles gave `writev` 22–35 % of the gateways' and workers' busy time,
// where `perf record -a` over the same load gave the node processes' kernel
// time as about 15 % of theirs (2026-12-07): measure a change to the writes
// with `perf` or `strace -c`, not with these shares.
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

function shorten(url) {
  const path = url.replace(/^file:\/\//, '');
  const nodeModules = path.lastIndexOf('node_modules/');
  if (nodeModules >= 0) {
    const rest = path.slice(nodeModules + 'node_modules/'.length).split('/');
    return rest[0].startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0];
  }
  const dist = path.indexOf('/dist/');
  if (dist >= 0)
    return path
      .slice(dist + 1)
      .split('/')
      .slice(0, 3)
      .join('/');
  return path || '(native)';
}

/** Self time of one `.cpuprofile`: total, by package or file, and by function (ms). */
export function summarizeProfile(file, top = 12) {
  const profile = JSON.parse(readFileSync(file, 'utf8'));
  const nodes = new Map(profile.nodes.map((node) => [node.id, node]));
  const selfUs = new Map();
  let totalUs = 0;
  profile.samples.forEach((id, index) => {
    const delta = profile.timeDeltas[index] ?? 0;
    selfUs.set(id, (selfUs.get(id) ?? 0) + delta);
    totalUs += delta;
  });
  const byPackage = new Map();
  const byFunction = new Map();
  let idleUs = 0;
  for (const [id, us] of selfUs) {
    const frame = nodes.get(id).callFrame;
    if (frame.functionName === '(idle)') {
      idleUs += us;
      continue;
    }
    const where = frame.url ? shorten(frame.url) : frame.functionName;
    byPackage.set(where, (byPackage.get(where) ?? 0) + us);
    const name = `${frame.functionName || '(anonymous)'} ${where}:${frame.lineNumber + 1}`;
    byFunction.set(name, (byFunction.get(name) ?? 0) + us);
  }
  const busyUs = totalUs - idleUs;
  const list = (map) =>
    [...map]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([name, us]) => ({
        name,
        ms: Math.round(us / 1000),
        share: Math.round((us / Math.max(1, busyUs)) * 1000) / 10,
      }));
  return {
    totalMs: Math.round(totalUs / 1000),
    busyMs: Math.round(busyUs / 1000),
    byPackage: list(byPackage),
    byFunction: list(byFunction),
  };
}

/** Summaries of every profile in `dir` (file name → summary). */
export function summarizeProfiles(dir) {
  const result = {};
  for (const name of readdirSync(dir).filter((n) => n.endsWith('.cpuprofile'))) {
    result[name] = summarizeProfile(join(dir, name));
  }
  return result;
}

export function formatProfile(name, summary) {
  const lines = [
    `${name}: busy ${summary.busyMs} ms of ${summary.totalMs} ms (share of busy time; startup included)`,
  ];
  for (const p of summary.byPackage) lines.push(`    ${String(p.share).padStart(5)}%  ${p.name}`);
  lines.push('  hottest functions:');
  for (const f of summary.byFunction) lines.push(`    ${String(f.share).padStart(5)}%  ${f.name}`);
  return lines.join('\n');
}
