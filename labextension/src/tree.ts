import { IListing, ISandbox, ISnapshot } from './api';

export interface ISandboxNode {
  kind: 'sandbox';
  sandbox: ISandbox;
  children: TreeNode[];
}

export interface ISnapshotNode {
  kind: 'snapshot';
  snapshot: ISnapshot;
  children: TreeNode[];
}

export type TreeNode = ISandboxNode | ISnapshotNode;

function createdAt(node: TreeNode): string {
  return (node.kind === 'sandbox' ? node.sandbox.created_at : node.snapshot.created_at) ?? '';
}

/**
 * The snapshot/branch tree of a listing: a sandbox's children are its snapshots and its
 * forks, a snapshot's children the sandboxes restored from it. A snapshot whose sandbox is
 * not listed hangs under the snapshot that sandbox came from (`parent_id`), else at the root;
 * so does a sandbox whose origin is not listed. Siblings are newest first.
 */
export function buildTree(listing: IListing): TreeNode[] {
  const sandboxes = new Map<string, ISandboxNode>();
  const snapshots = new Map<string, ISnapshotNode>();
  for (const sandbox of listing.sandboxes) {
    sandboxes.set(sandbox.id, { kind: 'sandbox', sandbox, children: [] });
  }
  for (const snapshot of listing.snapshots) {
    snapshots.set(snapshot.id, { kind: 'snapshot', snapshot, children: [] });
  }
  const roots: TreeNode[] = [];
  const attach = (node: TreeNode, parent: TreeNode | undefined): void => {
    (parent ? parent.children : roots).push(node);
  };
  for (const node of sandboxes.values()) {
    const { forked_from, from_snapshot } = node.sandbox;
    attach(
      node,
      (forked_from && sandboxes.get(forked_from)) ||
        (from_snapshot && snapshots.get(from_snapshot)) ||
        undefined
    );
  }
  for (const node of snapshots.values()) {
    const { sandbox_id, parent_id } = node.snapshot;
    attach(node, sandboxes.get(sandbox_id) || (parent_id && snapshots.get(parent_id)) || undefined);
  }
  const sort = (nodes: TreeNode[]): TreeNode[] => {
    nodes.sort((a, b) => createdAt(b).localeCompare(createdAt(a)));
    nodes.forEach(node => sort(node.children));
    return nodes;
  };
  return sort(roots);
}
