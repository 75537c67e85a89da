import express from 'express';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isServicePath, webAppAssets, type WebAppSettings } from './web-app-assets.js';

describe(webAppAssets.name, () => {
  let dir: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'cs-web-assets-'));
    writeFileSync(
      join(dir, 'index.html'),
      '<html><head><meta name="cs-dev-tokens" content="off" /></head><body></body></html>',
    );
    writeFileSync(join(dir, 'app.js'), 'console.log(1);');
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** GETs each path from an app serving `dir` with `settings`: status and body. */
  async function get(settings: WebAppSettings, ...paths: string[]) {
    const server = express().use(webAppAssets(dir, settings)).listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      return await Promise.all(
        paths.map(async (path) => {
          const response = await fetch(base + path);
          return { status: response.status, body: await response.text() };
        }),
      );
    } finally {
      server.close();
    }
  }

  it('tells the page whether development tokens are on', async () => {
    for (const [devTokens, content] of [
      [true, 'on'],
      [false, 'off'],
    ] as const) {
      for (const page of await get({ devTokens }, '/', '/index.html')) {
        expect(page.status).toBe(200);
        expect(page.body).toContain(`<meta name="cs-dev-tokens" content="${content}" />`);
      }
    }
  });

  it("serves the other files as they are, and leaves the service's paths alone", async () => {
    const [script, api] = await get({ devTokens: true }, '/app.js', '/api/index.html');
    expect(script).toEqual({ status: 200, body: 'console.log(1);' });
    expect(api?.status).toBe(404);
  });
});

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
