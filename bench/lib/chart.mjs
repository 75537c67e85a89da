// A small dependency-free SVG: latency percentiles (p50, p95, p99) of the
// sustained load against the throughput reached (msg/s). When the run has
// paced levels (one set of conversations at rising offered rates), those make
// the curve; otherwise the closed-loop levels do.

const WIDTH = 720;
const HEIGHT = 420;
const MARGIN = { top: 40, right: 60, bottom: 60, left: 80 };
const SERIES = [
  { key: 'p50', color: '#2f7ed8' },
  { key: 'p95', color: '#f28f43' },
  { key: 'p99', color: '#c0392b' },
];

const escape = (text) =>
  String(text).replaceAll('&', '&amp;').replaceAll('<', '&lt;').replaceAll('>', '&gt;');

/** @param {{ clients: number, offeredRate?: number | null, latency: { p50, p95, p99 }, throughput: { value } }[]} all */
export function latencyChartSvg(all) {
  const paced = all.filter((l) => l.offeredRate);
  const levels = (paced.length > 0 ? paced : all)
    .filter((l) => typeof l.throughput?.value === 'number')
    .sort((a, b) => a.throughput.value - b.throughput.value);
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const xMax = Math.max(...levels.map((l) => l.throughput.value), 1) * 1.1;
  const values = levels.flatMap((l) =>
    SERIES.map((series) => l.latency?.[series.key]).filter((v) => typeof v === 'number' && v > 0),
  );
  // Log scale on both axes: latencies span milliseconds to seconds.
  const yMinExp = Math.floor(Math.log10(Math.min(...values, 10)));
  const yMaxExp = Math.max(yMinExp + 1, Math.ceil(Math.log10(Math.max(...values, 10))));
  const x = (throughput) => MARGIN.left + (throughput / xMax) * plotW;
  const y = (value) =>
    MARGIN.top + plotH - ((Math.log10(value) - yMinExp) / (yMaxExp - yMinExp)) * plotH;
  const parts = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${HEIGHT}" viewBox="0 0 ${WIDTH} ${HEIGHT}" font-family="sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${HEIGHT}" fill="white"/>`,
    `<text x="${WIDTH / 2}" y="22" text-anchor="middle" font-size="14">Sustained load: message → echo latency against throughput</text>`,
  );
  for (let exp = yMinExp; exp <= yMaxExp; exp += 1) {
    for (const factor of exp < yMaxExp ? [1, 2, 5] : [1]) {
      const value = factor * 10 ** exp;
      const yy = y(value);
      const label = value >= 1000 ? `${value / 1000} s` : `${value} ms`;
      parts.push(
        `<line x1="${MARGIN.left}" x2="${WIDTH - MARGIN.right}" y1="${yy}" y2="${yy}" stroke="${factor === 1 ? '#d0d0d0' : '#eeeeee'}"/>`,
        `<text x="${MARGIN.left - 8}" y="${yy + 4}" text-anchor="end" fill="${factor === 1 ? '#000' : '#888'}">${escape(label)}</text>`,
      );
    }
  }
  for (const level of levels) {
    const xx = x(level.throughput.value);
    const label = level.offeredRate ? `${level.offeredRate}/s offered` : `${level.clients} clients`;
    parts.push(
      `<line x1="${xx}" x2="${xx}" y1="${MARGIN.top}" y2="${MARGIN.top + plotH}" stroke="#f0f0f0"/>`,
      `<text x="${xx}" y="${MARGIN.top + plotH + 18}" text-anchor="middle">${escape(level.throughput.value)}</text>`,
      `<text x="${xx}" y="${MARGIN.top + plotH + 34}" text-anchor="middle" fill="#555">${escape(label)}</text>`,
    );
  }
  const what =
    paced.length > 0
      ? `${paced[0].clients} conversations, each at its share of the offered rate`
      : 'closed loop';
  parts.push(
    `<text x="${MARGIN.left + plotW / 2}" y="${HEIGHT - 8}" text-anchor="middle">${escape(`messages/s answered (${what}); latency on a log scale`)}</text>`,
  );
  SERIES.forEach((series, index) => {
    const points = levels
      .filter((l) => typeof l.latency?.[series.key] === 'number')
      .map((l) => `${x(l.throughput.value)},${y(l.latency[series.key])}`);
    if (points.length > 1) {
      parts.push(
        `<polyline fill="none" stroke="${series.color}" stroke-width="2" points="${points.join(' ')}"/>`,
      );
    }
    for (const point of points) {
      const [px, py] = point.split(',');
      parts.push(`<circle cx="${px}" cy="${py}" r="3.5" fill="${series.color}"/>`);
    }
    const lx = MARGIN.left + 10 + index * 70;
    parts.push(
      `<rect x="${lx}" y="${MARGIN.top + 6}" width="12" height="12" fill="${series.color}"/>`,
      `<text x="${lx + 16}" y="${MARGIN.top + 16}">${series.key}</text>`,
    );
  });
  parts.push(
    `<line x1="${MARGIN.left}" x2="${MARGIN.left}" y1="${MARGIN.top}" y2="${MARGIN.top + plotH}" stroke="#333"/>`,
    `<line x1="${MARGIN.left}" x2="${WIDTH - MARGIN.right}" y1="${MARGIN.top + plotH}" y2="${MARGIN.top + plotH}" stroke="#333"/>`,
    '</svg>',
  );
  return `${parts.join('\n')}\n`;
}
