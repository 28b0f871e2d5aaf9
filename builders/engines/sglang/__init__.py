"""SGLang: its images are planned, preflighted and tested by image.py's `SGLang`, registered in
builders/engines/__init__.py; Forge does not serve it, so it has no pool settings."""
