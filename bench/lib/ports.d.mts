// Types of ports.mjs, for the tests (test/support/processes.ts).

/** A TCP port on the loopback interface that was free a moment ago (below the ephemeral range). */
export declare function freePort(): Promise<number>;
/** `count` different ports, each free a moment ago. */
export declare function freePorts(count: number): Promise<number[]>;
