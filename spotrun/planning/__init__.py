"""Plans and dry-runs: the one decision on the market the daemon reads, nothing written."""
