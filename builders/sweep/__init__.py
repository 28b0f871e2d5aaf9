"""`forge sweep`: the same seeded open-loop traffic against several stack profiles, one report side by side."""
