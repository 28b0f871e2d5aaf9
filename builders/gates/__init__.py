"""What a preflight gate is made of, whichever engine's build it guards: the finding it returns and the report
they make (findings.py), the build host's facts (host.py), the context every gate reads (context.py), and the
gates every build shares, disk and RAM (common.py). Each serving engine's own gates live in its package
(builders/engines/<name>/); builders/preflight/ runs them."""
