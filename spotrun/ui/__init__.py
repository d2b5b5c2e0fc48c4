"""Watching jobs: the views shared by the CLI's --json and the dashboard, the server, metrics."""
