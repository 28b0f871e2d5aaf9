"""verify-repro's comparison on layer tars written here: content differences listed, engine stamps ignored."""

from __future__ import annotations

import io
import tarfile

from builders.repro.compare import compare_images, config_differences
from builders.repro.image_export import ExportedImage, ImageConfig, Layer, read_layer

BASE = ("sha256:base",)
PYC_HEADER = b"\xa7\r\r\n" + b"\0\0\0\0"  # CPython 3.11 magic, timestamp-checked (flags 0)


def _layer_tar(files: dict[str, bytes | str], *, mtime: int, mode: int = 0o644) -> bytes:
    """A layer tar: bytes are files, a str value is a symlink target."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        dirs = sorted({"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.mode, info.size = mode, len(content)
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def _image(ref: str, layer: bytes, config: ImageConfig | None = None, diff_id: str = "") -> ExportedImage:
    entries = read_layer(io.BytesIO(layer))
    cfg: ImageConfig = config or {
        "created": f"2026-01-01T00:00:0{len(ref)}Z",
        "config": {"Env": ["PATH=/opt/venv/bin"], "User": "1000"},
        "history": [{"created": ref, "created_by": "FROM base"}, {"created": ref, "created_by": "RUN pip install"}],
    }
    return ExportedImage(
        ref=ref,
        image_id=f"sha256:{ref}",
        config=cfg,
        layers=(
            Layer(diff_id=BASE[0], member="base/layer.tar", created_by="FROM base"),
            Layer(
                diff_id=diff_id or f"sha256:{ref}",
                member="top/layer.tar",
                created_by="RUN pip install",
                entries=entries,
            ),
        ),
    )


def test_same_content_written_at_other_times_is_reproducible_with_mtimes_counted_apart() -> None:
    pyc = "opt/venv/__pycache__/a.cpython-311.pyc"
    files: dict[str, bytes | str] = {
        "opt/venv/a.py": b"x = 1\n",
        pyc: PYC_HEADER + b"\x01\0\0\0" + b"\x06\0\0\0" + b"CODE",
        "opt/venv/bin/py": "/usr/bin/python3",
    }
    first = _image("a", _layer_tar(files, mtime=100))
    changed = dict(files)
    # pip compiled the second copy of a.py at another time: only the pyc's copy of the source mtime differs.
    changed[pyc] = PYC_HEADER + b"\x02\0\0\0" + b"\x06\0\0\0" + b"CODE"
    second = _image("bb", _layer_tar(changed, mtime=200))
    result = compare_images(first, second, BASE)
    assert result.reproducible and not result.bit_identical
    # Every path was written at another time; nothing else differs.
    assert result.layers[0].mtime_only == len(first.layers[1].entries)
    assert "reproducible in content" in result.summary()
    strict = compare_images(first, second, BASE, strict_mtimes=True)
    assert not strict.reproducible
    assert {d.what for d in strict.differences} == {"mtime"}
    # A pyc whose code differs is content, whatever its header says.
    changed[pyc] = PYC_HEADER + b"\x02\0\0\0" + b"\x06\0\0\0" + b"EDOC"
    third = _image("ccc", _layer_tar(changed, mtime=200))
    assert [(d.path, d.what) for d in compare_images(first, third, BASE).differences] == [(f"/{pyc}", "content")]


def test_a_file_with_other_bytes_is_listed_with_both_hashes() -> None:
    first = _image("a", _layer_tar({"var/log/dpkg.log": b"2026-01-01 install\n", "etc/x": b"same"}, mtime=1))
    second = _image("bb", _layer_tar({"var/log/dpkg.log": b"2026-01-02 install\n", "etc/x": b"same"}, mtime=1))
    result = compare_images(first, second, BASE)
    assert not result.reproducible
    assert [(d.path, d.what) for d in result.differences] == [("/var/log/dpkg.log", "content")]
    assert "content: /var/log/dpkg.log" in result.summary()
    assert "NOT reproducible" in result.summary()


def test_paths_present_in_one_build_only_and_mode_changes_are_listed() -> None:
    first = _image("a", _layer_tar({"opt/a": b"1", "opt/gone": b"2"}, mtime=1))
    second = _image("bb", _layer_tar({"opt/a": b"1", "opt/new": b"2"}, mtime=1, mode=0o755))
    found = {(d.path, d.what) for d in compare_images(first, second, BASE).differences}
    assert found == {("/opt/gone", "only in first"), ("/opt/new", "only in second"), ("/opt/a", "mode")}


def test_equal_diff_ids_are_bit_identical() -> None:
    layer = _layer_tar({"opt/a": b"1"}, mtime=1)
    result = compare_images(_image("a", layer, diff_id="sha256:same"), _image("bb", layer, diff_id="sha256:same"), BASE)
    assert result.bit_identical and result.layers[0].identical


def test_engine_stamps_are_ignored_but_what_a_user_runs_is_compared() -> None:
    def config(created: str, user: str) -> ImageConfig:
        return {
            "created": created,
            "docker_version": created,
            "container": created,
            "config": {"User": user, "Env": ["A=1"]},
            "history": [{"created": created, "created_by": "RUN x"}],
            "rootfs": {"diff_ids": [created]},
        }

    assert config_differences(config("2026-01-01", "1000"), config("2027-05-05", "1000")) == []
    assert config_differences(config("2026-01-01", "1000"), config("2026-01-01", "0")) == ['config.User: "1000" vs "0"']


def test_a_different_base_or_layer_count_is_reported_as_structure() -> None:
    layer = _layer_tar({"opt/a": b"1"}, mtime=1)
    result = compare_images(_image("a", layer), _image("bb", layer), ("sha256:other-base",))
    assert not result.reproducible
    assert any("does not start with the base" in s for s in result.structure)
