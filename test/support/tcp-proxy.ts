// A TCP proxy in front of one or more app processes, standing in for a load
// balancer and a flaky network: it spreads connections over its targets
// (skipping those that refuse), and can cut every connection, refuse new ones,
// or drop what the servers send while still forwarding what clients send.
import { connect, createServer, type Server, type Socket } from 'node:net';

interface ProxiedConnection {
  client: Socket;
  upstream: Socket;
  target: number;
}

export class TcpProxy {
  /** New connections are closed at once (the service looks down). */
  refusing = false;
  /** How many connections were closed at once while `refusing`. */
  refused = 0;
  /** Bytes from the servers are dropped (answers are lost on the way back). */
  mutedDownstream = false;
  private readonly connections = new Set<ProxiedConnection>();
  private next = 0;

  private constructor(
    private readonly server: Server,
    readonly port: number,
    private readonly targets: () => readonly number[],
  ) {}

  static async start(targets: readonly number[] | (() => readonly number[])): Promise<TcpProxy> {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = server.address();
    const port = typeof address === 'object' && address ? address.port : 0;
    const proxy = new TcpProxy(
      server,
      port,
      typeof targets === 'function' ? targets : () => targets,
    );
    server.on('connection', (client) => proxy.accept(client));
    return proxy;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** The target ports of the connections open now. */
  targetsInUse(): number[] {
    return [...this.connections].map((connection) => connection.target);
  }

  /** Cuts every open connection, as a network failure would. */
  cut(): void {
    for (const { client, upstream } of this.connections) {
      client.destroy();
      upstream.destroy();
    }
    this.connections.clear();
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: Socket): void {
    client.on('error', () => undefined);
    if (this.refusing) {
      this.refused += 1;
      client.destroy();
      return;
    }
    client.pause();
    const targets = this.targets();
    const start = this.next++;
    const attempt = (tried: number) => {
      if (tried >= targets.length || client.destroyed) {
        client.destroy();
        return;
      }
      const target = targets[(start + tried) % targets.length]!;
      const upstream = connect(target, '127.0.0.1');
      let connected = false;
      upstream.on('error', () => {
        if (!connected) attempt(tried + 1);
      });
      upstream.once('connect', () => {
        connected = true;
        const connection = { client, upstream, target };
        this.connections.add(connection);
        upstream.on('data', (chunk: Buffer) => {
          if (!this.mutedDownstream) client.write(chunk);
        });
        client.on('data', (chunk: Buffer) => upstream.write(chunk));
        const close = () => {
          this.connections.delete(connection);
          client.destroy();
          upstream.destroy();
        };
        upstream.on('close', close);
        client.on('close', close);
        client.resume();
      });
    };
    attempt(0);
  }
}
