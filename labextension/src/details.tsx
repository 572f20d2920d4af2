import * as React from 'react';

import { Actions, IAction, sandboxActions, snapshotActions } from './actionbar';
import { SandforkActions } from './actions';
import { nodeLabel } from './graph';
import { Diff, Inventory, InventoryCache } from './inspector';
import { ISnapshotNode, LineageNode, createdAt } from './lineage';
import { KernelRewind } from './rewind';

export interface IDetailsProps {
  /** One node, or two snapshots to compare. */
  selection: LineageNode[];
  /** Whether the next click on a snapshot picks the one to compare with. */
  comparing: boolean;
  onCompare: (comparing: boolean) => void;
  onClear: () => void;
  actions: SandforkActions;
  rewind: KernelRewind;
  cache: InventoryCache;
}

/**
 * Below the graph, what is selected (`div.sandfork-Details`): a node's actions, and a
 * snapshot's variables; or, for two snapshots, what changed from the older to the newer.
 */
export function Details(props: IDetailsProps): JSX.Element | null {
  const [first, second] = props.selection;
  if (first === undefined) {
    return null;
  }
  if (second !== undefined && first.kind !== 'sandbox' && second.kind !== 'sandbox') {
    const [from, to] = [first, second].sort((a, b) => createdAt(a).localeCompare(createdAt(b)));
    return (
      <div className="sandfork-Details">
        <div className="sandfork-Details-title">
          Changes from <b>{nodeLabel(from)}</b> to <b>{nodeLabel(to)}</b>
        </div>
        <Actions
          actions={[
            { name: 'clear', label: 'Done', title: 'Back to the selection', run: props.onClear }
          ]}
        />
        <Diff from={from.snapshot} to={to.snapshot} cache={props.cache} />
      </div>
    );
  }
  return (
    <div className="sandfork-Details">
      <div className="sandfork-Details-title">
        <b>{nodeLabel(first)}</b> <span className="sandfork-Details-kind">{first.kind}</span>
      </div>
      <Actions actions={actionsOf(first, props)} />
      {props.comparing && (
        <p className="sandfork-Inspector-note">
          Click another snapshot or checkpoint to compare with (or Ctrl-click one).
        </p>
      )}
      {first.kind !== 'sandbox' && <SnapshotVariables node={first} cache={props.cache} />}
    </div>
  );
}

function SnapshotVariables(props: { node: ISnapshotNode; cache: InventoryCache }): JSX.Element {
  const { snapshot } = props.node;
  return snapshot.has_inventory ? (
    <Inventory snapshot={snapshot} cache={props.cache} />
  ) : (
    <p className="sandfork-Inspector-note">No inventory of variables was taken with it.</p>
  );
}

function actionsOf(node: LineageNode, props: IDetailsProps): IAction[] {
  if (node.kind === 'sandbox') {
    return sandboxActions(props.actions, node.sandbox);
  }
  const rewind: IAction[] =
    node.kind === 'checkpoint'
      ? [
          {
            name: 'rewind',
            label: 'Rewind here',
            title: "Restore this checkpoint in place, in its notebook's kernel",
            run: () => void props.rewind.toCheckpoint(node.snapshot)
          }
        ]
      : [];
  const compare: IAction = {
    name: 'compare',
    label: props.comparing ? 'Cancel compare' : 'Compare…',
    title: "Compare this snapshot's variables with another's",
    run: () => props.onCompare(!props.comparing)
  };
  return [...rewind, ...snapshotActions(props.actions, node.snapshot), compare];
}
