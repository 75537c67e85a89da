// Process start: a gateway and a worker added to the running cluster, each
// timed from spawn to ready (`/readyz`) with the CPU it spent to get there,
// then stopped. What a scale-out (a new pod) or a test that starts processes
// pays per process; the apps are bundled (scripts/bundle-apps.mjs) to cut it.
import { processCpuMs } from '../lib/proc.mjs';
import { formatSummary, summarize } from '../lib/stats.mjs';

const STARTS = 5;
const QUICK_STARTS = 2;

export async function runProcessStart(ctx) {
  const { cluster, options, log } = ctx;
  const count = options.quick ? QUICK_STARTS : STARTS;
  const result = {};
  for (const role of ['gateway', 'worker']) {
    const wall = [];
    const cpu = [];
    for (let i = 0; i < count; i += 1) {
      const started = performance.now();
      const proc = role === 'gateway' ? await cluster.startGateway() : await cluster.startWorker();
      wall.push(performance.now() - started);
      cpu.push(processCpuMs(proc.pid) ?? Number.NaN);
      if (role === 'gateway') await cluster.stopGateway(proc);
      else await cluster.stopWorker(proc, 'SIGTERM');
    }
    result[role] = { wall: summarize(wall), cpu: summarize(cpu) };
    log(`  ${role.padEnd(7)} spawn → ready  ${formatSummary(result[role].wall)}`);
    log(`  ${role.padEnd(7)} CPU to ready   ${formatSummary(result[role].cpu)}`);
  }
  return result;
}
