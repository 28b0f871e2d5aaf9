"""Write vLLM's registry record of each named model class into the running user's vLLM cache.

At every start `vllm serve` asks its model registry what the model's class supports (multimodal, pooling,
attention-free, ...). Unless VLLM_CACHE_ROOT/modelinfos holds the answer for the installed file of that class, it
finds out in a subprocess that imports torch and the model code: tens of seconds on one core, at every start of
a container whose home is thrown away. Run once in the image, as the runtime user, it is paid once.

Usage: warm_model_info.py CLASS [CLASS ...]   (exit 2 naming a class this vLLM does not know)
"""

from __future__ import annotations

import sys
import time


def main(names: list[str]) -> int:
    # vLLM's own registry does the inspection and writes the record, so the record is exactly what it reads back.
    from vllm.model_executor.models.registry import ModelRegistry  # type: ignore[import-not-found]

    unknown = [name for name in names if name not in ModelRegistry.models]
    if unknown:
        print(
            f"warm_model_info: this vLLM has no model class {', '.join(unknown)} "
            "(recipe key warm_model_classes); name classes from vLLM's model registry",
            file=sys.stderr,
        )
        return 2
    for name in names:
        start = time.monotonic()
        ModelRegistry.models[name].inspect_model_cls()
        print(f"warm_model_info: {name} recorded in {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
