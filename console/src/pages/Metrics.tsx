import { useMemo } from "react";
import { Link } from "react-router-dom";
import type { ChartConfiguration } from "chart.js";
import { getStats, type StatsPoint } from "../api";
import ChartCanvas from "../components/ChartCanvas";
import ErrorAlert from "../components/ErrorAlert";
import { clockTime, milliseconds, percent } from "../format";
import { useFilterParams } from "../useFilterParams";
import { useLoad } from "../useLoad";

const WINDOWS_MINUTES = [15, 30, 60];
const timeTicks = { maxRotation: 0, autoSkip: true, maxTicksLimit: 7 };
const COLORS = { calls: "#2f6fde", errors: "#d2382f", p50: "#1f9d6b", p99: "#b86e00" };

interface Summary {
  calls: number;
  errors: number;
  last?: StatsPoint;
}

function summarize(points: StatsPoint[]): Summary {
  const calls = points.reduce((sum, point) => sum + point.calls, 0);
  const errors = points.reduce((sum, point) => sum + point.errors, 0);
  const last = points.filter((point) => point.p50_ms !== null).at(-1);
  return { calls, errors, last };
}

/** One point per bucket across the window: the API lists only buckets that had calls. */
function everyBucket(points: StatsPoint[], bucketMs: number, minutes: number): StatsPoint[] {
  const bucketOf = (unixMs: number) => Math.floor(unixMs / bucketMs) * bucketMs;
  const byBucket = new Map(points.map((point) => [bucketOf(point.at_ms), point]));
  const last = bucketOf(Date.now());
  const count = Math.max(1, Math.round((minutes * 60_000) / bucketMs));
  return Array.from({ length: count }, (_, index) => {
    const at_ms = last - (count - 1 - index) * bucketMs;
    return byBucket.get(at_ms) ?? { at_ms, calls: 0, errors: 0, p50_ms: null, p99_ms: null };
  });
}

/** Calls, errors and latency per tool, minute by minute. */
export default function Metrics() {
  const filters = useFilterParams();
  const shownTool = filters.get("tool");
  // The server keeps an hour; a hand-edited link cannot ask the chart for more.
  const minutes = Math.min(60, Math.max(1, Math.round(Number(filters.get("minutes")) || 60)));
  const stats = useLoad(() => getStats(minutes), [minutes]);
  const allTools = stats.data?.tools ?? [];
  const tools = allTools.filter(({ tool }) => !shownTool || tool === shownTool);
  const bucketMs = stats.data?.bucket_ms ?? 60_000;

  return (
    <>
      <div className="page-head">
        <h1>Metrics</h1>
        <button type="button" onClick={stats.reload}>
          Refresh
        </button>
      </div>
      <form className="filters" onSubmit={(event) => event.preventDefault()}>
        <div className="field">
          <label htmlFor="metrics-window">Window</label>
          <select
            id="metrics-window"
            value={minutes}
            onChange={(event) => filters.set("minutes", event.target.value)}
          >
            {WINDOWS_MINUTES.map((option) => (
              <option key={option} value={option}>
                Last {option} minutes
              </option>
            ))}
          </select>
        </div>
        <div className="field">
          <label htmlFor="metrics-tool">Tool</label>
          <select
            id="metrics-tool"
            value={shownTool}
            onChange={(event) => filters.set("tool", event.target.value)}
          >
            <option value="">All tools</option>
            {[...new Set([...allTools.map(({ tool }) => tool), ...(shownTool ? [shownTool] : [])])]
              .sort()
              .map((tool) => (
                <option key={tool}>{tool}</option>
              ))}
          </select>
        </div>
      </form>
      <ErrorAlert error={stats.error} />
      {stats.data && tools.length === 0 && (
        <p className="muted">
          No calls{shownTool && ` of ${shownTool}`} in the last {minutes} minutes.
        </p>
      )}
      {tools.length > 0 && (
        <section className="card" aria-labelledby="summary-heading">
          <h2 id="summary-heading">Summary</h2>
          <div className="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Tool</th>
                  <th scope="col" className="number">
                    Calls
                  </th>
                  <th scope="col" className="number">
                    Error rate
                  </th>
                  <th scope="col" className="number">
                    Last p50
                  </th>
                  <th scope="col" className="number">
                    Last p99
                  </th>
                </tr>
              </thead>
              <tbody>
                {tools.map(({ tool, points }) => {
                  const summary = summarize(points);
                  return (
                    <tr key={tool}>
                      <th scope="row">
                        <Link to={`/tools/${encodeURIComponent(tool)}`}>{tool}</Link>
                      </th>
                      <td className="number">{summary.calls.toLocaleString()}</td>
                      <td className="number">
                        {summary.calls ? percent(summary.errors / summary.calls) : "—"}
                      </td>
                      <td className="number">{milliseconds(summary.last?.p50_ms)}</td>
                      <td className="number">{milliseconds(summary.last?.p99_ms)}</td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
        </section>
      )}
      {tools.map(({ tool, points }) => (
        <ToolCharts key={tool} tool={tool} points={points} bucketMs={bucketMs} minutes={minutes} />
      ))}
    </>
  );
}

interface ToolChartsProps {
  tool: string;
  points: StatsPoint[];
  bucketMs: number;
  minutes: number;
}

function ToolCharts({ tool, points: listed, bucketMs, minutes }: ToolChartsProps) {
  const [traffic, latency] = useMemo(() => {
    const points = everyBucket(listed, bucketMs, minutes);
    const labels = points.map((point) => clockTime(point.at_ms));
    const traffic: ChartConfiguration = {
      type: "bar",
      data: {
        labels,
        datasets: [
          {
            type: "bar",
            label: "Calls",
            data: points.map((point) => point.calls),
            backgroundColor: COLORS.calls,
            yAxisID: "calls",
          },
          {
            type: "line",
            label: "Error rate (%)",
            data: points.map((point) => (point.calls ? (100 * point.errors) / point.calls : null)),
            borderColor: COLORS.errors,
            backgroundColor: COLORS.errors,
            spanGaps: true,
            yAxisID: "errors",
          },
        ],
      },
      options: {
        maintainAspectRatio: false,
        animation: false,
        scales: {
          x: { ticks: timeTicks },
          calls: { type: "linear", position: "left", beginAtZero: true, ticks: { precision: 0 } },
          errors: { type: "linear", position: "right", min: 0, max: 100, grid: { drawOnChartArea: false } },
        },
      },
    };
    const latency: ChartConfiguration = {
      type: "line",
      data: {
        labels,
        datasets: [
          {
            label: "p50 (ms)",
            data: points.map((point) => point.p50_ms),
            borderColor: COLORS.p50,
            backgroundColor: COLORS.p50,
            spanGaps: true,
          },
          {
            label: "p99 (ms)",
            data: points.map((point) => point.p99_ms),
            borderColor: COLORS.p99,
            backgroundColor: COLORS.p99,
            spanGaps: true,
          },
        ],
      },
      options: {
        maintainAspectRatio: false,
        animation: false,
        scales: { x: { ticks: timeTicks }, y: { beginAtZero: true } },
      },
    };
    return [traffic, latency];
  }, [listed, bucketMs, minutes]);

  return (
    <section className="card" aria-labelledby={`metrics-${tool}`}>
      <h2 id={`metrics-${tool}`}>{tool}</h2>
      <div className="columns">
        <ChartCanvas
          config={traffic}
          label={`Calls and error rate per minute of ${tool} over the last ${minutes} minutes`}
        />
        <ChartCanvas
          config={latency}
          label={`p50 and p99 latency of ${tool} over the last ${minutes} minutes`}
        />
      </div>
    </section>
  );
}
