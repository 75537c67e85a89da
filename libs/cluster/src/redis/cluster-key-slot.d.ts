// cluster-key-slot (ioredis' own CRC16 of a key's hash tag) ships no types.
declare module 'cluster-key-slot' {
  /** The Redis Cluster slot (0-16383) of a key or channel, from its hash tag when it has one. */
  function calculateSlot(key: string | Buffer): number;
  export default calculateSlot;
}
