import { describe, expect, it } from 'vitest';
import { DevTokenHosts } from './dev-token-hosts.js';

describe(DevTokenHosts.name, () => {
  const hosts = new DevTokenHosts(['https://app.example.com', 'http://10.0.0.7:8080']);

  it('allows the loopback names and addresses, with any port and in any case', () => {
    for (const host of [
      'localhost',
      'localhost:3000',
      'LocalHost:80',
      '127.0.0.1',
      '127.0.0.1:49152',
      '[::1]',
      '[::1]:3000',
    ]) {
      expect(hosts.allows(host), host).toBe(true);
    }
  });

  it('allows the hosts of CORS_ORIGINS, with any port', () => {
    expect(hosts.allows('app.example.com')).toBe(true);
    expect(hosts.allows('app.example.com:443')).toBe(true);
    expect(hosts.allows('10.0.0.7:8080')).toBe(true);
  });

  it('refuses any other name or address, a missing Host and headers that are not a host', () => {
    for (const host of [
      undefined,
      '',
      'evil.example',
      'evil.example:3000',
      'localhost.evil.example',
      'example.com',
      '127.0.0.2',
      '0.0.0.0:3000',
      '[::2]',
      '192.168.1.10:3000',
      'user@localhost',
      'localhost/x',
      'localhost:3000:1',
      'localhost:port',
      ' localhost',
    ]) {
      expect(hosts.allows(host), String(host)).toBe(false);
    }
  });

  it('serves probes and metrics whatever the Host, and nothing else', () => {
    expect(DevTokenHosts.servesAnyHost('/healthz')).toBe(true);
    expect(DevTokenHosts.servesAnyHost('/readyz')).toBe(true);
    expect(DevTokenHosts.servesAnyHost('/metrics')).toBe(true);
    expect(DevTokenHosts.servesAnyHost('/api/dev/token')).toBe(false);
    expect(DevTokenHosts.servesAnyHost('/')).toBe(false);
  });

  it('refuses with 400 BAD_REQUEST naming the field Host', () => {
    const refusal = DevTokenHosts.refusal();
    expect(refusal.code).toBe('BAD_REQUEST');
    expect(refusal.field).toBe('Host');
  });
});
