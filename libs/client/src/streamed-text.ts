/**
 * The text streamed for each turn (keyed by `cause`, the user message it
 * answers), assembled by `offset`: a delta covers the characters
 * [offset, offset + delta.length) of the step's text. A delta that agrees with
 * what is there already (repeated, or late) changes nothing; one that
 * disagrees rewrites the text from its offset on (offset 0: the step starts
 * afresh, as after a retried model request or a new step); one beyond the end
 * (a delta lost before it) is dropped, and the catch-up delta a reconnect brings
 * fills the hole. Once the turn's answer is stored, its text is final.
 */
export class StreamedText {
  private readonly turns = new Map<number, { text: string; final: boolean }>();

  /** Applies one delta; true when the turn's text changed. */
  apply(cause: number, offset: number | undefined, delta: string): boolean {
    const turn = this.turns.get(cause) ?? { text: '', final: false };
    if (turn.final) return false;
    const at = offset ?? turn.text.length;
    if (at > turn.text.length) return false;
    if (turn.text.slice(at, at + delta.length) === delta) {
      this.turns.set(cause, turn);
      return false;
    }
    turn.text = turn.text.slice(0, at) + delta;
    this.turns.set(cause, turn);
    return true;
  }

  /** The stored answer to `cause`: its text wins over anything streamed. */
  finish(cause: number, content: string): void {
    this.turns.set(cause, { text: content, final: true });
  }

  text(cause: number): string {
    return this.turns.get(cause)?.text ?? '';
  }

  isFinal(cause: number): boolean {
    return this.turns.get(cause)?.final ?? false;
  }
}
