/**
 * A start refused for what the operator set up (an agent module that does
 * not load, a default agent that does not exist): the process stops with its
 * message as the one line to read, without a stack.
 */
export class StartupError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'StartupError';
  }
}
