// Builds the web app (web/) into dist/web/, which the gateway and the standalone
// app serve at `/`. The SDK is taken from its source (libs/client/src), so the
// app never waits for the SDK's own build.
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url));

export default defineConfig({
  root: here('.'),
  base: '/',
  publicDir: false,
  resolve: { alias: { '@cs/client': here('../libs/client/src/index.ts') } },
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: here('../dist/web'),
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: false,
    reportCompressedSize: false,
  },
});
