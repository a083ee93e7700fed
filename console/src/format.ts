/** Display helpers shared by the pages. */

export const milliseconds = (ms: number | null | undefined) =>
  ms == null ? "—" : `${ms < 10 ? ms.toFixed(2) : Math.round(ms).toLocaleString()} ms`;

export function bytes(count: number): string {
  const units = ["bytes", "KiB", "MiB", "GiB"];
  let value = count;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${count.toLocaleString()} bytes` : `${value.toFixed(1)} ${units[unit]}`;
}

export const dateTime = (unixMs: number) => new Date(unixMs).toLocaleString();

export const clockTime = (unixMs: number) =>
  new Date(unixMs).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

export const percent = (fraction: number) =>
  `${(fraction * 100).toFixed(fraction > 0 && fraction < 0.1 ? 1 : 0)}%`;

export const prettyJson = (value: unknown) => JSON.stringify(value, null, 2);

export function elapsed(ms: number): string {
  const seconds = Math.round(ms / 1000);
  if (seconds < 60) {
    return `${seconds} s`;
  }
  const minutes = Math.round(seconds / 60);
  return minutes < 60 ? `${minutes} min` : `${(minutes / 60).toFixed(1)} h`;
}
