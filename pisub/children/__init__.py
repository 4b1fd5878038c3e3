"""Child adapters: how the runner starts, reads and ends one kind of sub-agent."""
