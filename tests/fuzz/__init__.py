"""Coverage-guided fuzzing (atheris) of every parser of what a tenant writes (tests/fuzz/targets.py)."""
