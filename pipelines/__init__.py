"""Turn-taking, budgets, speculation, agent wiring, events and the command line."""
