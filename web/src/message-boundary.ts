// Each entry of the timeline is drawn inside one of these: should drawing it
// throw, that entry alone shows its fallback (a message, its text) and the
// rest of the timeline, later messages included, goes on being drawn. Without
// it, one exception unmounts the whole page.
import { Component, type ComponentChildren } from 'preact';

export interface MessageBoundaryProps {
  /** What is shown instead of the children once drawing them has thrown. */
  fallback: () => ComponentChildren;
  children?: ComponentChildren;
}

export class MessageBoundary extends Component<MessageBoundaryProps, { failed: boolean }> {
  override state = { failed: false };

  static override getDerivedStateFromError(): { failed: boolean } {
    return { failed: true };
  }

  override componentDidCatch(error: unknown): void {
    console.error('A message could not be drawn; it is shown as text.', error);
  }

  override render(): ComponentChildren {
    return this.state.failed ? this.props.fallback() : this.props.children;
  }
}
