import { Lineage, LineageNode, createdAt } from './lineage';

/** A snapshot proper or a sandbox, with what hangs under it. */
export interface ITreeNode {
  node: LineageNode;
  children: ITreeNode[];
}

/**
 * The side panel's list of all snapshots and sandboxes, as a tree: a sandbox's children are
 * its snapshots and its forks, a snapshot's the sandboxes restored from it. Checkpoints are
 * left out (the history graph shows them): what hangs under one hangs under its nearest
 * ancestor shown, else at the root. So are sandboxes that are gone, unless something hangs
 * under them. Siblings are newest first.
 */
export function buildTree(lineage: Lineage): ITreeNode[] {
  const shown = new Map<LineageNode, ITreeNode>();
  for (const node of lineage.nodes) {
    if (node.kind !== 'checkpoint') {
      shown.set(node, { node, children: [] });
    }
  }
  const roots: ITreeNode[] = [];
  for (const [node, item] of shown) {
    let parent = lineage.parent(node);
    while (parent && !shown.has(parent)) {
      parent = lineage.parent(parent);
    }
    const under = parent ? shown.get(parent) : undefined;
    (under?.children ?? roots).push(item);
  }
  const tidy = (items: ITreeNode[]): ITreeNode[] =>
    items
      .map(item => ({ ...item, children: tidy(item.children) }))
      .filter(
        ({ node, children }) =>
          node.kind !== 'sandbox' || node.sandbox.status !== 'gone' || children.length > 0
      )
      .sort((a, b) => createdAt(b.node).localeCompare(createdAt(a.node)));
  return tidy(roots);
}
