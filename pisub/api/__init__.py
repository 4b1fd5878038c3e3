"""The typed client API every face (CLI, pi tool, Python) goes through."""
