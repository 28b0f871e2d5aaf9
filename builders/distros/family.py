"""Distro families: how to install roles of packages, enable repos and compilers, and bootstrap a base.

Per-release facts (versions, package names, image references) live in distros/*.yaml; these classes hold
only what a whole family does the same way.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from typing import ClassVar

from builders.config.models import Distro, Role

EXPIRED_ARCHIVE_APT_OPTION = 'Acquire::Check-Valid-Until "false"'
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


class DistroFamily:
    """Interface every family implements. Subclasses override class attributes and the few differing methods."""

    name: ClassVar[str]
    package_manager: ClassVar[str]
    # Where the distro's lib dir is; tcmalloc and friends live under it.
    lib_dir: ClassVar[str]

    def __init__(self, distro: Distro) -> None:
        self.distro = distro

    def packages(self, roles: Iterable[Role]) -> list[str]:
        seen: list[str] = []
        for role in roles:
            for pkg in self.distro.packages.get(role, ()):
                if pkg not in seen:
                    seen.append(pkg)
        return seen

    def install_command(self, packages: Sequence[str]) -> str:
        raise NotImplementedError

    def repo_setup_command(self) -> str | None:
        """Enable extra repositories (EPEL, CRB) before installing; None when the base has all it needs."""
        return None

    def compiler_env(self) -> dict[str, str]:
        """Environment that makes the build use the distro's chosen compiler."""
        enable = self.distro.compiler_enable
        if enable is None:
            return {"CC": "gcc", "CXX": "g++"}
        return {
            "CC": f"{enable.prefix}/bin/gcc",
            "CXX": f"{enable.prefix}/bin/g++",
            "PATH": f"{enable.prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        }

    def bootstrap_command(self, output_tar: str, *, source_date_epoch: int | None = None) -> list[str]:
        raise NotImplementedError


class DebianFamily(DistroFamily):
    name = "debian"
    package_manager = "apt-get"
    lib_dir = "/usr/lib/x86_64-linux-gnu"

    def install_command(self, packages: Sequence[str]) -> str:
        pkgs = " ".join(shlex.quote(p) for p in packages)
        # One layer: update, install without recommends, and drop the lists so they never reach an image; the
        # logs and caches apt, dpkg and ldconfig write carry the time of the build, so two builds would differ.
        return (
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
            f"{pkgs} && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/ldconfig/aux-cache "
            "/var/log/apt /var/log/dpkg.log /var/log/alternatives.log"
        )

    def bootstrap_command(self, output_tar: str, *, source_date_epoch: int | None = None) -> list[str]:
        boot = self.distro.base.bootstrap
        assert boot is not None
        cmd = [
            "mmdebstrap",
            "--variant=minbase",
            f"--components={','.join(boot.components)}",
            f"--include={','.join(boot.include)}",
            "--format=tar",
            # Another architecture's base runs its maintainer scripts under qemu-user-static (binfmt_misc).
            f"--arch={DEBIAN_ARCH[self.distro.arch]}",
            # Docker images carry no apt lists; keep the base small and deterministic.
            "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*.bin",
        ]
        if boot.keyring:
            cmd.append(f"--keyring={boot.keyring}")
        if not boot.check_valid_until:
            # A snapshot archive's Release file is past Valid-Until by design. --aptopt lets the bootstrap read it
            # and lands in the base's /etc/apt/apt.conf.d, so apt-get in every later build stage accepts it too.
            cmd.append(f"--aptopt={EXPIRED_ARCHIVE_APT_OPTION}")
        cmd += [boot.suite, output_tar, boot.mirror]
        return cmd


class UbuntuFamily(DebianFamily):
    name = "ubuntu"


class FedoraFamily(DistroFamily):
    name = "fedora"
    package_manager = "dnf"
    lib_dir = "/usr/lib64"

    def install_command(self, packages: Sequence[str]) -> str:
        pkgs = " ".join(shlex.quote(p) for p in packages)
        return f"dnf install -y --setopt=install_weak_deps=False {pkgs} && dnf clean all && rm -rf /var/cache/dnf"

    def bootstrap_command(self, output_tar: str, *, source_date_epoch: int | None = None) -> list[str]:
        boot = self.distro.base.bootstrap
        assert boot is not None
        force_arch = "" if self.distro.arch == "x86_64" else f" --forcearch={self.distro.arch}"
        script = (
            "set -e; root=$(mktemp -d); "
            f'dnf -y --installroot="$root" --releasever={shlex.quote(boot.suite)}{force_arch} '
            f"--repofrompath=forge,{shlex.quote(boot.mirror)} --repo=forge --setopt=install_weak_deps=False "
            f"--nogpgcheck install {' '.join(shlex.quote(p) for p in boot.include)}; "
            'dnf --installroot="$root" clean all; '
            f'tar --sort=name --numeric-owner -C "$root" -cf {shlex.quote(output_tar)} .'
        )
        return ["sh", "-c", script]


class UbiFamily(FedoraFamily):
    name = "ubi"

    def repo_setup_command(self) -> str | None:
        if not self.distro.extra_repos:
            return None
        repos = " ".join(shlex.quote(r) for r in self.distro.extra_repos)
        # EPEL carries gperftools (tcmalloc); CRB carries -devel packages UBI's own repos leave out.
        return f"dnf install -y {repos} && (dnf config-manager --set-enabled crb 2>/dev/null || true) && dnf clean all"


FAMILIES: dict[str, type[DistroFamily]] = {
    cls.name: cls for cls in (DebianFamily, UbuntuFamily, FedoraFamily, UbiFamily)
}


def family_for(distro: Distro) -> DistroFamily:
    return FAMILIES[distro.family](distro)
