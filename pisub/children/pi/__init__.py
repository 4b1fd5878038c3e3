"""The pi child kind: RPC, pi's versions and models, the tool-budget extension."""
