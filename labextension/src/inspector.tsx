import * as React from 'react';

import {
  IInventory,
  IInventoryDiff,
  ISnapshot,
  IVariable,
  getInventory,
  getInventoryDiff
} from './api';
import { formatBytes } from './format';
import { errorMessage } from './progress';

/**
 * The inventories and diffs asked for so far. A snapshot does not change: what the server
 * could answer is kept (not "unavailable" nor errors, which may pass) until `keep` drops it.
 */
export class InventoryCache {
  inventory(id: string): Promise<IInventory> {
    return this.remember(
      id,
      () => getInventory(id),
      answer => answer.status === 'ok'
    );
  }

  diff(from: string, to: string): Promise<IInventoryDiff> {
    return this.remember(
      `${from} ${to}`,
      () => getInventoryDiff(from, to),
      () => true
    );
  }

  /** Forgets what involves snapshots not in `ids` (deleted ones). */
  keep(ids: ReadonlySet<string>): void {
    for (const key of this._answers.keys()) {
      if (key.split(' ').some(id => !ids.has(id))) {
        this._answers.delete(key);
      }
    }
  }

  private remember<T>(key: string, ask: () => Promise<T>, lasts: (answer: T) => boolean) {
    let answer = this._answers.get(key) as Promise<T> | undefined;
    if (answer === undefined) {
      const asked = ask();
      this._answers.set(key, asked);
      const forget = (): void => {
        if (this._answers.get(key) === asked) {
          this._answers.delete(key);
        }
      };
      asked.then(value => lasts(value) || forget(), forget);
      answer = asked;
    }
    return answer;
  }

  private readonly _answers = new Map<string, Promise<unknown>>();
}

interface ILoaded<T> {
  key: string;
  value?: T;
  error?: string;
}

/** The answer of `load` for `key`, once it came (loaded again when `key` changes). */
function useLoaded<T>(key: string, load: () => Promise<T>): ILoaded<T> {
  const [loaded, setLoaded] = React.useState<ILoaded<T>>({ key: '' });
  React.useEffect(() => {
    let wanted = true;
    load().then(
      value => wanted && setLoaded({ key, value }),
      error => wanted && setLoaded({ key, error: errorMessage(error) })
    );
    return () => {
      wanted = false;
    };
  }, [key]);
  return loaded.key === key ? loaded : { key };
}

/** An array's "3 × 2", a container's length. */
function extent(variable: IVariable): string {
  if (variable.shape !== null) {
    return variable.shape.join(' × ');
  }
  return variable.length !== null ? String(variable.length) : '';
}

function size(variable: IVariable): string {
  return variable.bytes !== null ? formatBytes(variable.bytes) : '';
}

/** "DataFrame · 3 × 2 · 48 B". */
function summary(variable: IVariable): string {
  return [variable.type, extent(variable), size(variable)].filter(Boolean).join(' · ');
}

function Pending(props: { loaded: ILoaded<unknown>; what: string }): JSX.Element {
  return props.loaded.error !== undefined ? (
    <div className="sandfork-SnapshotsPanel-error">{props.loaded.error}</div>
  ) : (
    <p className="sandfork-Inspector-note">Loading the {props.what}…</p>
  );
}

/** The variables of a snapshot's kernel: `table.sandfork-Inventory`, a row per variable. */
export function Inventory(props: { snapshot: ISnapshot; cache: InventoryCache }): JSX.Element {
  const { snapshot, cache } = props;
  const loaded = useLoaded(snapshot.id, () => cache.inventory(snapshot.id));
  const inventory = loaded.value;
  if (!inventory) {
    return <Pending loaded={loaded} what="variables" />;
  }
  if (inventory.status !== 'ok') {
    return (
      <p className="sandfork-Inspector-note">
        No variables: {inventory.reason ?? 'the inventory is unavailable'}.
      </p>
    );
  }
  return (
    <>
      <table className="sandfork-Inventory">
        <thead>
          <tr>
            <th>Name</th>
            <th>Type</th>
            <th>Shape</th>
            <th>Size</th>
          </tr>
        </thead>
        <tbody>
          {inventory.variables.map(variable => (
            <tr key={variable.name} data-name={variable.name}>
              <td className="sandfork-Inventory-name">{variable.name}</td>
              <td>{variable.type}</td>
              <td>{extent(variable)}</td>
              <td>{size(variable)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <p className="sandfork-Inspector-note">
        {inventory.variables.length} variable{inventory.variables.length === 1 ? '' : 's'}
        {inventory.truncated ? ' (more were left out)' : ''}
      </p>
    </>
  );
}

interface IChange {
  name: string;
  change: 'added' | 'removed' | 'changed';
  text: string;
}

const SIGNS: Record<IChange['change'], string> = { added: '+', removed: '−', changed: '~' };

/** What changed between two snapshots' variables: `table.sandfork-Diff`. */
export function Diff(props: {
  from: ISnapshot;
  to: ISnapshot;
  cache: InventoryCache;
}): JSX.Element {
  const { from, to, cache } = props;
  const loaded = useLoaded(`${from.id} ${to.id}`, () => cache.diff(from.id, to.id));
  const diff = loaded.value;
  if (!diff) {
    return <Pending loaded={loaded} what="changes" />;
  }
  const rows: IChange[] = [
    ...diff.added.map(v => ({ name: v.name, change: 'added' as const, text: summary(v) })),
    ...diff.removed.map(v => ({ name: v.name, change: 'removed' as const, text: summary(v) })),
    ...diff.changed.map(({ name, before, after }) => {
      const [was, is] = [summary(before), summary(after)];
      const text = was === is ? `${is} (new value)` : `${was} → ${is}`;
      return { name, change: 'changed' as const, text };
    })
  ].sort((a, b) => a.name.localeCompare(b.name));
  return (
    <>
      <table className="sandfork-Diff">
        <tbody>
          {rows.map(({ name, change, text }) => (
            <tr key={name} data-name={name} data-change={change}>
              <td className="sandfork-Diff-sign">{SIGNS[change]}</td>
              <td className="sandfork-Inventory-name">{name}</td>
              <td>{text}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <p className="sandfork-Inspector-note">
        {diff.added.length} added · {diff.removed.length} removed · {diff.changed.length} changed ·{' '}
        {diff.unchanged.length} unchanged
      </p>
    </>
  );
}
