"""`forge verify-repro`: two builds of the same inputs, compared (repro.py), and its command."""
