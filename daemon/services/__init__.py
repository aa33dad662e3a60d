"""Background services the daemon runs beside the verbs: scrub, autosnap, NVML telemetry."""
