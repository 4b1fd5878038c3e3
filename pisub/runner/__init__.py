"""The detached runner: one process per run that supervises its child."""
