import { describe, expect, it } from 'vitest';
import { StartupError } from '@cs/config';
import { checkShardedPubSub } from './redis-io.adapter.js';

/** A Redis whose `INFO server` says it runs `version` (or fails). */
function redisOf(version: string | Error) {
  return {
    info: async () => {
      if (version instanceof Error) throw version;
      return `# Server\r\nredis_version:${version}\r\nredis_mode:standalone\r\n`;
    },
  };
}

describe(checkShardedPubSub.name, () => {
  it('lets Redis 7.0 and later through', async () => {
    for (const version of ['7.0.15', '7.2.4', '8.0.0']) {
      await expect(checkShardedPubSub(redisOf(version), 'REDIS_URL')).resolves.toBeUndefined();
    }
  });

  it('refuses an older Redis with one line naming the variable', async () => {
    const refusal = checkShardedPubSub(redisOf('6.2.14'), 'REDIS_URL');
    await expect(refusal).rejects.toBeInstanceOf(StartupError);
    await expect(refusal).rejects.toThrow(
      "REDIS_URL: Redis 6.2.14 has no sharded pub/sub, which the gateway's Socket.IO adapter needs: use Redis 7.0 or later",
    );
  });

  it('lets a Redis that refuses INFO through', async () => {
    await expect(
      checkShardedPubSub(redisOf(new Error('ERR unknown command')), 'REDIS_URL'),
    ).resolves.toBeUndefined();
  });
});
