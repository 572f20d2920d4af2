// Removes the previous build output so that no stale module survives a rename.
import { rmSync } from "node:fs";

rmSync(new URL("../dist", import.meta.url), { recursive: true, force: true });
