"""gpfl: server."""
