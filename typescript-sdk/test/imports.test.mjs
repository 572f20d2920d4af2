// The modules of src/ import one another without a cycle (type-only imports count too), and
// only routes.ts spells the API's paths. No engine needed.

import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { test } from "node:test";

const SRC = new URL("../src/", import.meta.url);

/** The relative modules a TypeScript source imports or re-exports, as file names in src/. */
export function importsOf(text) {
  const found = new Set();
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  const patterns = [
    // import … from "x", import type … from "x", export … from "x"
    /\b(?:import|export)\s+(?:type\s+)?[^;'"]*?\bfrom\s*["']([^"']+)["']/g,
    /\bimport\s*["']([^"']+)["']/g, // import "x" (for its effects)
    /\bimport\s*\(\s*["']([^"']+)["']\s*\)/g, // import("x"), also in type positions
  ];
  for (const pattern of patterns) {
    for (const m of code.matchAll(pattern)) {
      if (m[1].startsWith("./")) found.add(m[1].slice(2).replace(/\.js$/, ".ts"));
    }
  }
  return [...found].sort();
}

/** The import graph of src/*.ts: each module's imports among them. */
function graph() {
  const modules = readdirSync(SRC).filter((f) => f.endsWith(".ts"));
  return new Map(
    modules.map((m) => [m, importsOf(readFileSync(new URL(m, SRC), "utf8"))]),
  );
}

/** Every cycle of `edges` (a module → the modules it imports), each as a path of modules. */
export function cycles(edges) {
  const found = [];
  const state = new Map(); // undefined: unseen, 1: on the stack, 2: done
  const stack = [];
  const visit = (node) => {
    state.set(node, 1);
    stack.push(node);
    for (const next of edges.get(node) ?? []) {
      if (state.get(next) === 1) found.push([...stack.slice(stack.indexOf(next)), next]);
      else if (state.get(next) === undefined) visit(next);
    }
    stack.pop();
    state.set(node, 2);
  };
  for (const node of [...edges.keys()].sort()) if (state.get(node) === undefined) visit(node);
  return found;
}

test("the check sees every kind of import, and a cycle", () => {
  const text = [
    'import { a } from "./a.js";',
    'import type { B } from "./b.js";',
    "import {\n  type C,\n  c,\n} from './c.js';",
    'export { d } from "./d.js";',
    'export * as e from "./e.js";',
    'import "./f.js";',
    'let g: import("./g.js").G;',
    '// import { x } from "./commented.js";',
    'import { readFileSync } from "node:fs";',
  ].join("\n");
  assert.deepEqual(importsOf(text), ["a.ts", "b.ts", "c.ts", "d.ts", "e.ts", "f.ts", "g.ts"]);
  const edges = new Map([
    ["a.ts", ["b.ts"]],
    ["b.ts", ["c.ts"]],
    ["c.ts", ["a.ts"]],
    ["d.ts", []],
  ]);
  assert.deepEqual(cycles(edges), [["a.ts", "b.ts", "c.ts", "a.ts"]]);
});

test("src/*.ts import one another without a cycle", () => {
  const edges = graph();
  assert.ok(edges.get("sandbox.ts").includes("explore.ts"), "the graph was not read");
  for (const [module, imports] of edges) {
    for (const imported of imports) assert.ok(edges.has(imported), `${module} imports ${imported}`);
  }
  assert.deepEqual(cycles(edges), []);
});

test("only routes.ts (and http.ts, under /v1) spells the API's paths", () => {
  const route = /["'`][^"'`\n]*\/(v1|sandboxes|snapshots|changes|templates|health)\b/;
  const offenders = [];
  for (const file of readdirSync(SRC).filter((f) => f.endsWith(".ts"))) {
    if (file === "routes.ts") continue;
    const lines = readFileSync(new URL(file, SRC), "utf8").split("\n");
    lines.forEach((line, i) => {
      const code = line
        .replace(/\/\/.*$/, "")
        .replace(/^\s*\*.*$|\/\*.*?\*\//g, "")
        .replace(/["']\.\/[\w.-]+["']/g, ""); // a module's own name: "./snapshot.js"
      if (route.test(code)) offenders.push(`${file}:${i + 1}: ${line.trim()}`);
    });
  }
  assert.deepEqual(offenders, []);
});
