import { useEffect, useRef } from "react";
import {
  BarController,
  BarElement,
  CategoryScale,
  Chart,
  Legend,
  LinearScale,
  LineController,
  LineElement,
  PointElement,
  Tooltip,
  type ChartConfiguration,
} from "chart.js";

Chart.register(
  BarController,
  BarElement,
  CategoryScale,
  Legend,
  LinearScale,
  LineController,
  LineElement,
  PointElement,
  Tooltip,
);

/** A chart.js chart; `config` should keep its identity between renders (useMemo). */
export default function ChartCanvas({ config, label }: { config: ChartConfiguration; label: string }) {
  const canvasRef = useRef<HTMLCanvasElement>(null);
  useEffect(() => {
    if (!canvasRef.current) {
      return;
    }
    const chart = new Chart(canvasRef.current, config);
    return () => chart.destroy();
  }, [config]);
  return (
    <div className="chart">
      <canvas ref={canvasRef} role="img" aria-label={label}>
        {label}
      </canvas>
    </div>
  );
}
