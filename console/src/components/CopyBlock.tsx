import { useRef, useState } from "react";

/** Text to paste elsewhere, with a Copy button; where the clipboard is out of reach (an
 * insecure origin, a denied permission) it selects the text for the user to copy. */
export default function CopyBlock({ label, text }: { label: string; text: string }) {
  const textRef = useRef<HTMLPreElement>(null);
  const [status, setStatus] = useState("");

  async function copy() {
    try {
      await navigator.clipboard.writeText(text);
      setStatus("Copied.");
    } catch {
      const selection = window.getSelection();
      if (textRef.current && selection) {
        selection.selectAllChildren(textRef.current);
      }
      setStatus("Selected: press Ctrl+C (⌘C on a Mac) to copy.");
    }
  }

  return (
    <div className="copy-block">
      <div className="copy-bar">
        <button type="button" onClick={copy} aria-label={`Copy ${label}`}>
          Copy
        </button>
        <span className="muted" aria-live="polite">
          {status}
        </span>
      </div>
      <pre ref={textRef} tabIndex={0} aria-label={label}>
        {text}
      </pre>
    </div>
  );
}
