import { Button } from '@jupyterlab/ui-components';
import * as React from 'react';

import { SandforkActions, snapshotLabel } from './actions';
import { ISandbox, ISnapshot } from './api';

/** A button of the side panel: `name` is its `data-action`. */
export interface IAction {
  name: string;
  label: string;
  title: string;
  run: () => void;
}

/** A row of small buttons (class `sandfork-Tree-action`, `data-action` their name). */
export function Actions(props: { actions: IAction[] }): JSX.Element {
  return (
    <span className="sandfork-Tree-actions">
      {props.actions.map(action => (
        <Button
          key={action.name}
          minimal
          small
          className="sandfork-Tree-action"
          data-action={action.name}
          title={action.title}
          onClick={action.run}
        >
          {action.label}
        </Button>
      ))}
    </span>
  );
}

/** What can be done with a snapshot: restore, rename (not a checkpoint), delete, copy its id. */
export function snapshotActions(actions: SandforkActions, snapshot: ISnapshot): IAction[] {
  const checkpoint = snapshot.kind === 'checkpoint';
  return [
    {
      name: 'restore',
      label: 'Restore',
      title: `Restore ${snapshotLabel(snapshot)} into a new notebook`,
      run: () => void actions.restore(snapshot)
    },
    ...(checkpoint
      ? []
      : [
          {
            name: 'rename',
            label: 'Rename',
            title: 'Rename this snapshot',
            run: () => void actions.rename(snapshot)
          }
        ]),
    {
      name: 'delete',
      label: 'Delete',
      title: `Delete this ${checkpoint ? 'checkpoint' : 'snapshot'}`,
      run: () => void actions.remove(snapshot)
    },
    copyId(actions, snapshot.id)
  ];
}

/** Whether a kernel of this server runs in the sandbox, and the sandbox is running. */
export function isLive(sandbox: ISandbox): boolean {
  return sandbox.kernel_id !== null && sandbox.status === 'running';
}

/** What can be done with a sandbox: fork it while its notebook's kernel is live, copy its id. */
export function sandboxActions(actions: SandforkActions, sandbox: ISandbox): IAction[] {
  const fork: IAction[] =
    isLive(sandbox) && sandbox.notebook_path !== null
      ? [
          {
            name: 'fork',
            label: 'Fork',
            title: 'Fork this live sandbox into branch notebooks',
            run: () => void actions.forkSandbox(sandbox)
          }
        ]
      : [];
  return [...fork, copyId(actions, sandbox.id)];
}

function copyId(actions: SandforkActions, id: string): IAction {
  return {
    name: 'copy-id',
    label: 'Copy ID',
    title: `Copy ${id} to the clipboard`,
    run: () => actions.copyId(id)
  };
}
