import { Lineage, LineageNode, createdAt } from './lineage';

/** A node of the history graph, where it is drawn. */
export interface IPlacedNode {
  node: LineageNode;
  /** Rows go down in time: parents above their children. */
  row: number;
  /** The column of its sandbox (each sandbox has one, its snapshots in it). */
  lane: number;
  /** Where the edge to it comes from: its parent in the graph. */
  parent: IPlacedNode | null;
}

export interface IGraphLayout {
  /** By row. */
  nodes: IPlacedNode[];
  lanes: number;
}

/**
 * A notebook's history: the snapshots and sandboxes connected to its kernel's sandbox and to
 * its kernel's checkpoints (their lineage id: the kernel moves to a new sandbox on every
 * rewind or restore, and pruning old checkpoints can cut the links between those).
 */
export function historyOf(
  lineage: Lineage,
  sandboxId: string | null,
  kernelLineage: string | null
): LineageNode[] {
  const pending = [...lineage.nodes].filter(node =>
    node.kind === 'sandbox'
      ? node.id === sandboxId
      : kernelLineage !== null && node.snapshot.lineage === kernelLineage
  );
  const found = new Set<LineageNode>();
  for (let node = pending.pop(); node; node = pending.pop()) {
    if (!found.has(node)) {
      found.add(node);
      const parent = lineage.parent(node);
      pending.push(...lineage.children(node), ...(parent ? [parent] : []));
    }
  }
  return [...found];
}

/**
 * Where to draw `nodes` (a part of `lineage`), like a version-control log: one row per node,
 * oldest first with every parent above its children; one lane (column) per sandbox, holding
 * the snapshots taken of it. A lane stays taken down to the last row that hangs from it, so
 * edges into other lanes do not cross a lane reused in between.
 */
export function layOut(lineage: Lineage, nodes: LineageNode[]): IGraphLayout {
  const included = new Set(nodes);
  const parentOf = (node: LineageNode): LineageNode | null => {
    const parent = lineage.parent(node);
    return parent && included.has(parent) ? parent : null;
  };

  // When a node was made, but never before its parent (a sandbox that is gone has no time),
  // and how deep it hangs: sorting on both puts parents first.
  const keys = new Map<LineageNode, [string, number]>();
  const key = (node: LineageNode): [string, number] => {
    let known = keys.get(node);
    if (known === undefined) {
      const parent = parentOf(node);
      const [after, depth] = parent ? key(parent) : ['', -1];
      const made = createdAt(node);
      known = [made > after ? made : after, depth + 1];
      keys.set(node, known);
    }
    return known;
  };
  const ordered = [...nodes].sort((a, b) => {
    const [timeA, depthA] = key(a);
    const [timeB, depthB] = key(b);
    return timeA.localeCompare(timeB) || depthA - depthB || a.id.localeCompare(b.id);
  });
  const rows = new Map(ordered.map((node, row) => [node, row]));

  // A snapshot goes in its sandbox's lane; a sandbox (or a snapshot without it) opens one.
  const owner = (node: LineageNode): LineageNode => {
    const parent = parentOf(node);
    return node.kind !== 'sandbox' && parent?.kind === 'sandbox' ? parent : node;
  };
  const lastRow = new Map<LineageNode, number>();
  for (const [node, row] of rows) {
    const parent = parentOf(node);
    for (const taken of parent ? [owner(node), owner(parent)] : [owner(node)]) {
      lastRow.set(taken, Math.max(lastRow.get(taken) ?? row, row));
    }
  }

  const laneEnds: number[] = [];
  const lanes = new Map<LineageNode, number>();
  const placed = new Map<LineageNode, IPlacedNode>();
  for (const [node, row] of rows) {
    const taker = owner(node);
    let lane = lanes.get(taker);
    if (lane === undefined) {
      lane = laneEnds.findIndex(end => end < row);
      lane = lane < 0 ? laneEnds.length : lane;
      laneEnds[lane] = lastRow.get(taker) ?? row;
      lanes.set(taker, lane);
    }
    const parent = parentOf(node);
    placed.set(node, { node, row, lane, parent: parent ? (placed.get(parent) ?? null) : null });
  }
  return { nodes: [...placed.values()], lanes: laneEnds.length };
}
