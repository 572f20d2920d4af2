"""The state every benchmark holds: distinct, non-zero pages (nothing for deduplication or
zero-page tricks to flatter), quick to make even under TCG. ``{n}`` is its size in bytes."""

HELD = "(np.arange({n} // 8, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.uint8)"
