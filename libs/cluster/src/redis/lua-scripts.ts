import { readFileSync } from 'node:fs';
import type { RedisConnection } from './redis-connections.js';

/** The Lua scripts in `lua/`, named `<what-it-does>-<number of keys>.lua`. */
const SCRIPTS = [
  'acquire-slot-2',
  'renew-slots-2',
  'release-slot-2',
  'reserve-action-1',
  'record-failover-1',
  'hold-budget-1',
  'settle-budget-1',
] as const;
type ScriptName = (typeof SCRIPTS)[number];

const sources = new Map<ScriptName, { lua: string; numberOfKeys: number }>(
  SCRIPTS.map((name) => [
    name,
    {
      lua: readFileSync(new URL(`../lua/${name}.lua`, import.meta.url), 'utf8'),
      numberOfKeys: Number(name.slice(name.lastIndexOf('-') + 1)),
    },
  ]),
);

/**
 * Runs a script by its SHA (EVALSHA, loading it on NOSCRIPT) through ioredis'
 * `defineCommand`, so that every call sends only the keys and arguments.
 */
export function runScript(
  redis: RedisConnection,
  name: ScriptName,
  keys: string[],
  args: Array<string | number>,
): Promise<unknown> {
  const command = `cs_${name.replace(/-/g, '_')}`;
  const commands = redis as unknown as Record<
    string,
    (...params: Array<string | number>) => Promise<unknown>
  >;
  if (typeof commands[command] !== 'function') {
    const script = sources.get(name)!;
    redis.defineCommand(command, { lua: script.lua, numberOfKeys: script.numberOfKeys });
  }
  return commands[command]!(...keys, ...args);
}
