"""The plan of llama.cpp's image: `llama-server`, CPU backend, compiled from the llama.cpp tree PyPI's
llama-cpp-python sdist vendors.

Why that source: it is a sha256-pinned file on PyPI, fetched and locked exactly as vLLM's sdist is (`forge fetch`,
forge.lock), reachable wherever PyPI is, and identical for every distro. Debian forky's `llama.cpp` source package
would tie the tree to one distro's archive and its patches, and reach only Debian-family builds.
"""

from __future__ import annotations

from builders.config.models import Distro, Recipe
from builders.distros import family_for
from builders.engines.llama_cpp.tree import GGML_ISA_FLAGS, VENDORED
from builders.errors import ConfigError
from builders.plan import BuildPlan, ContextItem, PlanOptions, image_build_args, image_labels
from builders.platforms import platform_of

# Everything but the ISA, which comes from the recipe as build args. Why each is set:
CMAKE_DEFINES: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    # One static llama-server: the runtime stage copies one file and needs no libllama/libggml beside it.
    "BUILD_SHARED_LIBS": "OFF",
    # The build host's CPU must never choose the instruction sets (-march=native): the recipe's ISA args do.
    "GGML_NATIVE": "OFF",
    # ggml's own thread pool instead of OpenMP: no libgomp to install in the runtime on each distro family.
    "GGML_OPENMP": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_TOOLS": "ON",
    "LLAMA_BUILD_SERVER": "ON",
    "LLAMA_BUILD_APP": "OFF",
    # The web UI is off, and its prebuilt assets would be downloaded from Hugging Face mid-build.
    "LLAMA_BUILD_UI": "OFF",
    "LLAMA_USE_PREBUILT_UI": "OFF",
    # HTTPS model downloads are not what a server behind Forge's router needs, and OpenSSL headers are not a role.
    "LLAMA_OPENSSL": "OFF",
}


ENGINE_NAME = "llama-cpp"


def plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    """llama-server's image: compiled in the build stage with every ISA option named, one static binary in the
    runtime stage."""
    if distro.arch != "x86_64":
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: the llama-cpp recipe's ISA settings are x86 options, "
            f"and distros/{distro.name}.yaml is {distro.arch}",
            hint="build it on an x86_64 distro",
        )
    unknown = sorted(set(recipe.isa) - set(GGML_ISA_FLAGS))
    if unknown:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: isa.{unknown[0]} is not one of GGML's CPU-backend ISA options",
            hint=f"use {', '.join(GGML_ISA_FLAGS)} (ggml/CMakeLists.txt), each ON or OFF",
        )
    bad = sorted(k for k, v in recipe.isa.items() if v not in {"ON", "OFF"})
    if bad:
        raise ConfigError(f"recipes/{recipe.name}.yaml: isa.{bad[0]} is {recipe.isa[bad[0]]!r}, not ON or OFF")
    assert recipe.source is not None and recipe.source.pypi is not None
    pin = recipe.source.pypi
    family = family_for(distro)
    roles = ["c_compiler", "cmake", "build_tools"] + (["ccache"] if "ccache" in distro.packages else [])
    # Every ISA option is passed, so a default in ggml's CMake (ON for some with GGML_NATIVE=OFF) never decides.
    isa = {key: recipe.isa.get(key, "OFF") for key in GGML_ISA_FLAGS}
    version = options.vllm_version or pin.version
    compile_env = {k: v for k, v in family.compiler_env().items() if k != "PATH"}
    compile_env.update(recipe.build_env)
    compile_env["MAX_JOBS"] = str(options.max_jobs)
    build_args = image_build_args({"BASE_IMAGE": distro.base.local_tag, **isa}, options)
    enabled = " ".join(k.removeprefix("GGML_") for k, v in isa.items() if v == "ON") or "none"
    labels = image_labels(
        distro,
        recipe,
        version=version,
        base_name=distro.base.pinned_ref,
        base_digest=options.base_digest or distro.base.digest or "unpinned",
    ) | {
        "dev.forge.platform": platform_of(distro).name,
        "dev.forge.engine": ENGINE_NAME,
        "dev.forge.isa": f"GGML_NATIVE=OFF; ON: {enabled}",
    }
    return BuildPlan(
        distro=distro,
        recipe=recipe,
        target=recipe.target,
        base_ref=distro.base.local_tag,
        image_tag=options.tag or f"forge/{distro.name}-{recipe.target}{platform_of(distro).suffix}:{version}",
        containerfile="Containerfile",
        template=recipe.template,
        final_stage="runtime",
        max_jobs=options.max_jobs,
        buildkit=options.buildkit,
        trust_ca_bundle=options.trust_ca_bundle,
        cmake_from_pip=False,
        torch=None,
        compile_env=compile_env,
        build_args=build_args,
        context=(
            ContextItem(
                name=f"sources/{pin.name}-{pin.version}.tar.gz",
                kind="sdist",
                origin=f"PyPI {pin.name}=={pin.version} sha256:{pin.sha256} ({VENDORED})",
            ),
        ),
        labels=labels,
        secrets=(),
        runtime_packages=(),
        build_packages=tuple(family.packages(roles)),  # type: ignore[arg-type]
        vllm_version=version,
        test_checks=("llama-server-version", "no-compilers", "serve-gguf") if recipe.serve_test else (),
        cmake_defines=dict(CMAKE_DEFINES),
        launcher_packages=tuple(family.packages(["python"])),
    )
