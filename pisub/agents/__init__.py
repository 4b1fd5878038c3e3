"""Agent definitions: the catalogue, agent files and the built-in agents."""
