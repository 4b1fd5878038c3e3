"""Runs and their trees on disk: the files of a run, its mailbox, leases, results and the tree's ledgers."""
