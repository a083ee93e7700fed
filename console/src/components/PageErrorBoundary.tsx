import { Component, type ReactNode } from "react";

interface Props {
  children: ReactNode;
  /** The page's path: a failure is forgotten when the user goes to another page. */
  path: string;
}

/** Shows a page's failure in its place, so the header, the navigation and the other pages
 * keep working. */
export default class PageErrorBoundary extends Component<Props, { error: unknown; path: string }> {
  state = { error: null as unknown, path: this.props.path };

  static getDerivedStateFromError(error: unknown) {
    return { error };
  }

  static getDerivedStateFromProps(props: Props, state: { error: unknown; path: string }) {
    return props.path === state.path ? null : { error: null, path: props.path };
  }

  render() {
    if (this.state.error === null) {
      return this.props.children;
    }
    const message = this.state.error instanceof Error ? this.state.error.message : String(this.state.error);
    return (
      <p role="alert" className="alert">
        This page failed to show: {message}. The other pages still work.
      </p>
    );
  }
}
