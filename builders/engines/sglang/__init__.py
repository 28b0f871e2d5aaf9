"""SGLang: its image is planned, preflighted and tested by image.py (kind: native, loaded by the recipe's engine name)."""
