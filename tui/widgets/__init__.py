"""One widget per module: devices, allocations, detail, scrub, events."""
