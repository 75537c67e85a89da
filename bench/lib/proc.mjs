// CPU and memory of processes from /proc (Linux): what each role of the
// cluster, the load generator and the machine as a whole spent during a
// scenario.
import { readFileSync, readdirSync } from 'node:fs';
import { loadavg } from 'node:os';

const CLOCK_TICKS_PER_SECOND = 100; // `getconf CLK_TCK` on Linux x86_64

/** utime + stime of a process in milliseconds, or null when it is gone. */
export function processCpuMs(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name may hold spaces: the fields start after its closing parenthesis.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    return (ticks * 1000) / CLOCK_TICKS_PER_SECOND;
  } catch {
    return null;
  }
}

/** Resident set size in KiB (VmRSS), or null when the process is gone. */
export function processRssKiB(pid) {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const match = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
    return match ? Number(match[1]) : null;
  } catch {
    return null;
  }
}

/** Every process of the machine: pid, command name and command line (with its title). */
export function processTable() {
  const table = [];
  let entries;
  try {
    entries = readdirSync('/proc');
  } catch {
    return table;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const comm = readFileSync(`/proc/${entry}/comm`, 'utf8').trim();
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
      table.push({ pid: Number(entry), comm, cmdline });
    } catch {
      // gone meanwhile
    }
  }
  return table;
}

/** pid → CPU ms and a short label (command name, or the script a node process runs). */
function everyProcessCpu() {
  const result = new Map();
  for (const row of processTable()) {
    const ms = processCpuMs(row.pid);
    if (ms === null) continue;
    const args = row.cmdline.split(' ');
    let label = row.comm;
    if (row.comm === 'node' || row.comm.startsWith('node')) {
      const script = args.slice(1).find((a) => !a.startsWith('-'));
      label = `node ${script ? script.split('/').slice(-4).join('/') : ''}`.trim();
    } else if (row.cmdline.startsWith('postgres: ')) {
      label = 'postgres (other databases, background)';
    }
    result.set(row.pid, { ms, label });
  }
  return result;
}

/** Busy and total jiffies of all CPUs since boot. */
function systemTicks() {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '';
    const values = line.trim().split(/\s+/).slice(1).map(Number);
    const idle = (values[3] ?? 0) + (values[4] ?? 0);
    // user nice system idle iowait irq softirq steal (guest time is already in user)
    const total = values.slice(0, 8).reduce((a, b) => a + b, 0);
    const steal = values[7] ?? 0;
    return {
      busy: total - idle - steal,
      total,
      irq: (values[5] ?? 0) + (values[6] ?? 0),
      steal,
    };
  } catch {
    return { busy: 0, total: 0, irq: 0, steal: 0 };
  }
}

/**
 * Starts measuring CPU. `targets()` lists `{ name, pid }` (called at the start
 * and at the end; several pids may share a name, their CPU adds up). `stop()`
 * returns, per name, the share of one core used (100 = one core busy), plus
 * the bench process itself, the whole machine (100 × cores when every core is
 * busy) and the 1-minute load average before and after. A pid that appears
 * meanwhile counts from zero; one that exits before `stop()` is left out.
 */
export function startCpuMeter(targets) {
  const list = typeof targets === 'function' ? targets : () => targets;
  const startedAt = performance.now();
  const before = new Map(list().map((t) => [t.pid, processCpuMs(t.pid)]));
  const everyBefore = everyProcessCpu();
  const selfBefore = process.cpuUsage();
  const systemBefore = systemTicks();
  const loadBefore = loadavg()[0];
  return {
    stop() {
      const elapsedMs = performance.now() - startedAt;
      const percent = (ms) => (elapsedMs > 0 ? Math.round((ms / elapsedMs) * 1000) / 10 : null);
      const usedMs = new Map();
      for (const target of list()) {
        const end = processCpuMs(target.pid);
        if (end === null) continue;
        const start = before.get(target.pid) ?? 0;
        usedMs.set(target.name, (usedMs.get(target.name) ?? 0) + Math.max(0, end - (start ?? 0)));
      }
      const perProcess = {};
      for (const [name, ms] of usedMs) perProcess[name] = percent(ms);
      // Who else used the machine meanwhile (other users' work, shared daemons).
      const mine = new Set([process.pid, ...list().map((t) => t.pid)]);
      const others = new Map();
      for (const [pid, entry] of everyProcessCpu()) {
        if (mine.has(pid)) continue;
        const used = entry.ms - (everyBefore.get(pid)?.ms ?? 0);
        if (used > 0) others.set(entry.label, (others.get(entry.label) ?? 0) + used);
      }
      const otherTop = [...others]
        .sort((a, b) => b[1] - a[1])
        .slice(0, 3)
        .map(([label, ms]) => ({ label, percent: percent(ms) }))
        .filter((o) => o.percent >= 1);
      const self = process.cpuUsage(selfBefore);
      const systemAfter = systemTicks();
      const totalTicks = systemAfter.total - systemBefore.total;
      const busyShare = totalTicks > 0 ? (systemAfter.busy - systemBefore.busy) / totalTicks : 0;
      const share = (ticks) =>
        totalTicks > 0 ? Math.round((ticks / totalTicks) * 1000 * cpuCount()) / 10 : 0;
      return {
        seconds: Math.round(elapsedMs / 100) / 10,
        processes: perProcess,
        bench: percent((self.user + self.system) / 1000),
        machine: Math.round(busyShare * 1000 * cpuCount()) / 10,
        // Interrupt work (loopback networking) and time the hypervisor kept: in "other".
        irq: share(systemAfter.irq - systemBefore.irq),
        steal: share(systemAfter.steal - systemBefore.steal),
        loadAverage: [Math.round(loadBefore * 100) / 100, Math.round(loadavg()[0] * 100) / 100],
        otherTop,
      };
    },
  };
}

let cores;
function cpuCount() {
  if (cores === undefined) {
    try {
      cores = readFileSync('/proc/stat', 'utf8')
        .split('\n')
        .filter((line) => /^cpu\d+ /.test(line)).length;
    } catch {
      cores = 1;
    }
  }
  return cores || 1;
}

/** CPU shares grouped by role, e.g. for the console. */
export function cpuByRole(cpu) {
  const sum = (prefix) =>
    Math.round(
      Object.entries(cpu.processes)
        .filter(([name]) => name.startsWith(prefix))
        .reduce((total, [, value]) => total + (value ?? 0), 0),
    );
  return {
    gateways: sum('gateway'),
    workers: sum('worker'),
    postgres: sum('postgres'),
    redis: sum('redis'),
    bench: Math.round(cpu.bench ?? 0),
    machine: Math.round(cpu.machine),
  };
}

export function formatCpu(cpu) {
  if (!cpu) return 'CPU: not measured';
  const r = cpuByRole(cpu);
  return (
    `CPU (% of one core): gateways ${r.gateways}, workers ${r.workers}, postgres ${r.postgres},` +
    ` redis ${r.redis}, load generator ${r.bench}; machine ${r.machine} of ${100 * cpuCount()}` +
    ` (irq ${Math.round(cpu.irq ?? 0)}, steal ${Math.round(cpu.steal ?? 0)})` +
    ` (load average ${cpu.loadAverage.join(' → ')})` +
    (cpu.otherTop?.length
      ? `; others: ${cpu.otherTop.map((o) => `${o.label} ${Math.round(o.percent)}`).join(', ')}`
      : '')
  );
}
