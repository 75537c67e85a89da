import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

// The directions of imports of docs/design.md ("Libraries"): protocol and
// core are plain TypeScript (no framework, driver or network library), core
// knows only protocol, and store and cluster never reach into each other.
const FRAMEWORKS = [
  '@nestjs/*',
  'express',
  'pg',
  '@electric-sql/*',
  'ioredis',
  'bullmq',
  'socket.io',
  'socket.io-*',
  '@socket.io/*',
  'prom-client',
  'pino',
  'pino-*',
  'nestjs-pino',
  '@opentelemetry/*',
];
/** A relative import into another lib's sources (`../../cluster/src/…`). */
const intoLib = (...libs) => `^(\\.\\./)+(libs/)?(${libs.join('|')})/`;
const directions = (message, { packages = [], libs = [], relative = [] }) => [
  ...(packages.length > 0 ? [{ group: packages, message }] : []),
  ...(libs.length > 0 ? [{ group: libs, message }] : []),
  ...(relative.length > 0 ? [{ regex: intoLib(...relative), message }] : []),
];
/** Test support (fakes, the in-memory store, test agents) never reaches the shipped build. */
const TEST_SUPPORT = [
  { regex: '(^|/)testing/', message: 'test support (testing/) is for specs and tests only' },
  { regex: '^(\\.\\./)+test/', message: 'the test tree is for specs and tests only' },
];
/** Sources that ship in dist/: not specs, not test support. */
const PRODUCTION = { ignores: ['**/*.spec.ts', 'libs/*/src/testing/**'] };
const rule = (patterns) => ({ 'no-restricted-imports': ['error', { patterns }] });
/**
 * A lib's import directions for all its files, and for its production files
 * the same plus no test support (a later block's rule replaces an earlier one's).
 */
const restrict = (files, message, options) => [
  { files, rules: rule(directions(message, options)) },
  { files, ...PRODUCTION, rules: rule([...directions(message, options), ...TEST_SUPPORT]) },
];
const OTHER_LIBS = [
  'store',
  'cluster',
  'gateway',
  'agents',
  'config',
  'observability',
  'process',
  'client',
  'core',
];

export default tseslint.config(
  {
    ignores: [
      'dist/**',
      'node_modules/**',
      'coverage/**',
      '.data/**',
      'bench/results/**',
      'libs/client/dist/**',
      'test/artifacts/**',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
      globals: { ...globals.node },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': [
        'error',
        { checksVoidReturn: { arguments: false } },
      ],
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_' },
      ],
      '@typescript-eslint/consistent-type-imports': ['error', { disallowTypeAnnotations: false }],
    },
  },
  {
    files: ['**/*.js', '**/*.mjs', '**/*.cjs'],
    extends: [tseslint.configs.disableTypeChecked],
  },
  {
    files: ['**/*.cjs'],
    languageOptions: { sourceType: 'commonjs', globals: { ...globals.commonjs } },
  },
  {
    files: ['apps/*/public/**/*.js', 'libs/*/public/**/*.js'],
    languageOptions: { globals: { ...globals.browser } },
  },
  {
    // The web app and the client SDK run in browsers (the SDK in Node 20+ too).
    files: ['web/**/*.{ts,tsx}', 'libs/client/src/**/*.ts'],
    languageOptions: { globals: { ...globals.browser } },
  },
  {
    files: ['apps/*/src/**/*.ts', 'libs/*/src/**/*.{ts,tsx}'],
    ...PRODUCTION,
    rules: rule(TEST_SUPPORT),
  },
  ...restrict(
    ['libs/protocol/src/**/*.ts'],
    'libs/protocol holds wire schemas: it imports zod and nothing of the domain',
    { packages: FRAMEWORKS, libs: ['@cs/*'], relative: OTHER_LIBS },
  ),
  ...restrict(
    ['libs/core/src/**/*.ts'],
    'libs/core is the plain domain: it imports libs/protocol only, no store, cluster, gateway or framework',
    {
      packages: FRAMEWORKS,
      libs: ['@cs/*', '!@cs/protocol'],
      relative: OTHER_LIBS.filter((lib) => lib !== 'core'),
    },
  ),
  ...restrict(['libs/store/src/**/*.ts'], 'libs/store and libs/cluster never import each other', {
    packages: ['ioredis', 'bullmq'],
    libs: ['@cs/cluster'],
    relative: ['cluster'],
  }),
  ...restrict(['libs/cluster/src/**/*.ts'], 'libs/store and libs/cluster never import each other', {
    packages: ['pg', '@electric-sql/*'],
    libs: ['@cs/store'],
    relative: ['store'],
  }),
  {
    files: ['**/*.spec.ts', 'test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/unbound-method': 'off',
      // Response bodies in tests are checked by assertions, not by types.
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/require-await': 'off',
    },
  },
);
