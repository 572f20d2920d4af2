/** "2 GiB", "512 MiB". */
export function formatMemory(megabytes: number): string {
  return megabytes >= 1024 && megabytes % 1024 === 0
    ? `${megabytes / 1024} GiB`
    : `${megabytes} MiB`;
}

/** "1.2 GB", "340 MB", "12 kB". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  const digits = value < 10 && unit > 0 ? 1 : 0;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** A timestamp from the API, short, in the user's locale. */
export function formatTime(iso: string): string {
  const date = new Date(iso);
  return Number.isNaN(date.getTime())
    ? iso
    : date.toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' });
}

/** A timestamp from the API, time of day only ("14:03:07"), in the user's locale. */
export function formatClock(iso: string): string {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleTimeString(undefined);
}
