/**
 * Splits NDJSON text, as it arrives in chunks, into complete lines: a line
 * is complete at its `\n` (a `\r` before it is dropped); what follows the
 * last `\n` waits for the next chunk, or for `end()`.
 */
export class NdjsonLines {
  private rest = '';

  /** The lines that `chunk` completes. */
  push(chunk: string): string[] {
    // Only the new chunk is scanned: a long line arriving in many chunks stays linear.
    if (!chunk.includes('\n')) {
      this.rest += chunk;
      return [];
    }
    const lines = chunk.split('\n');
    lines[0] = this.rest + lines[0]!;
    this.rest = lines.pop()!;
    return lines.map(stripCarriageReturn);
  }

  /** The last line, when the text did not end with `\n`. */
  end(): string[] {
    const last = this.rest;
    this.rest = '';
    return last.length > 0 ? [stripCarriageReturn(last)] : [];
  }
}

function stripCarriageReturn(line: string): string {
  return line.endsWith('\r') ? line.slice(0, -1) : line;
}
