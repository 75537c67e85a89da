// Ports for the processes the tests, the benchmark and the chaos run start.
// They are picked below Linux's ephemeral range (32768–60999), from which
// every outgoing connection of the machine takes its local port, so that a
// port picked for a listener is not one a connection holds a moment later.
// Another listener may still take it between the pick and the bind: the
// tests' apps (test/support/processes.ts) and the Redis Cluster's nodes
// (redis-cluster.mjs) are then started again on other ports.
import { createServer } from 'node:net';

const PICKED = { from: 20_000, to: 32_000 };

/** A TCP port on the loopback interface that was free a moment ago. */
export async function freePort() {
  for (let attempt = 0; attempt < 100; attempt += 1) {
    const port = PICKED.from + Math.floor(Math.random() * (PICKED.to - PICKED.from));
    if (await canListen(port)) return port;
  }
  throw new Error(`no free port between ${PICKED.from} and ${PICKED.to}`);
}

/** `count` different ports, each free a moment ago. */
export async function freePorts(count) {
  const ports = new Set();
  while (ports.size < count) ports.add(await freePort());
  return [...ports];
}

function canListen(port) {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}
