import { describe, expect, it } from 'vitest';
import { isServicePath } from './web-app-assets.js';

describe(isServicePath.name, () => {
  it('claims the service paths however they are spelled', () => {
    for (const path of [
      '/api',
      '/api/conversations/..%2f..%2findex.html',
      '/api/conversations/%2e%2e%2f%2e%2e',
      '/API/conversations',
      '/%61pi/conversations/..%2f..%2findex.html',
      '//api/conversations',
      '/socket.io/',
      '/docs',
      '/docs/..%2findex.html',
      '/docs-json',
      '/healthz',
      '/readyz/x',
      '/metrics',
      '/%E0%A4%A', // not decodable: the router answers it
    ]) {
      expect(isServicePath(path), path).toBe(true);
    }
  });

  it("leaves the web app's own files to it", () => {
    for (const path of [
      '/',
      '/index.html',
      '/assets/index-abc.js',
      '/apis',
      '/docsx',
      '/healthz.html',
    ]) {
      expect(isServicePath(path), path).toBe(false);
    }
  });
});
