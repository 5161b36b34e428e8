"""Proving shipped kernels without writing into them: a wheel's, or an installed package's.

``dsv41-aot verify --wheel FILE --against-jit`` and ``verify --against-jit
--record`` of the installed kernels run ``aot.verify.verify`` on a scratch
copy, so pip's files and the wheel stay as they are; ``--record`` then
prints the proofs it made.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import AotError
from ..listing import rooms_in
from ..proof import VERIFIED
from .verify import fixes, verify


def installed_kernels(root: Path) -> bool:
    """Whether pip installed ``root``'s files: a ``*.dist-info/RECORD`` in a folder above it lists them.

    Whichever installation it is (this one, another venv's, ``pip install
    --target``): pip's files are never rewritten."""
    root = Path(root).resolve()
    for top in root.parents:
        inside = "\n" + root.relative_to(top).as_posix() + "/"  # a RECORD line naming a file in root
        for record in top.glob("*.dist-info/RECORD"):
            try:
                if inside in "\n" + record.read_text(errors="replace"):
                    return True
            except OSError:  # unreadable: it says nothing
                pass
    return False


def verify_shipped(*, wheel: Path | None = None, folder: Path | None = None, **kw) -> dict:
    """``verify`` of a wheel's kernels, or of an installed package's, that writes nothing into them.

    The kernels are copied into a scratch folder and verified there (with
    ``--against-jit``, proven from their bands); the wheel is judged first
    (``wheel.judge``) and its problems are failures too. ``recorded`` holds
    each room's verified.json as ``--record`` made it, for the caller to
    print: the wheel or the installed files stay as they are. Paths in the
    report name the wheel (``WHEEL!/<arch>/...``) or the folder, never the
    scratch copy."""
    import json
    import shutil
    import tempfile

    from .wheel import FIX_DOWNLOAD, PKG, judge, open_wheel

    verdict = judge(wheel) if wheel is not None else None
    with tempfile.TemporaryDirectory(prefix="dsv41-verify-shipped-") as tmp:
        root = Path(tmp).resolve() / "kernels"  # as verify names its files, whether or not TMPDIR is a symlink
        if wheel is not None:
            with open_wheel(wheel) as z:
                for n in z.namelist():
                    if n.startswith(PKG) and not n.endswith("/"):
                        dest = root / n[len(PKG):]
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(z.read(n))
        else:
            shutil.copytree(folder, root, ignore=shutil.ignore_patterns("__pycache__"))
        shown = f"{Path(wheel).resolve()}!" if wheel is not None else str(Path(folder).resolve())
        given, flag = (wheel, "--wheel") if wheel is not None else (folder, "--dir")
        try:
            report = verify(root, **kw)
        except AotError as e:  # named by the wheel or folder asked about, never by the scratch copy
            fix = e.fix if str(root) not in (e.fix or "") else f"ask only for what it holds (dsv41-aot verify {flag} " \
                                                               f"{given} lists it)"  # a wheel is not built into
            raise type(e)(e.message.replace(f"{root}/", f"{shown}/").replace(str(root), str(given)), fix=fix) from None
        recorded = {}
        if kw.get("record"):
            for room in rooms_in(root):
                if room.has(VERIFIED):
                    recorded[room.name] = json.loads(room.proof().to_bytes())
        named = json.dumps(report).replace(f"dsv41-aot verify --dir {root}", f"dsv41-aot verify {flag} {given}")
        report = json.loads(named.replace(str(root), shown))
        restore = {room.fix_restore.replace(str(root), shown) for room in rooms_in(root)}  # "copy the copy again"
    report["recorded"] = recorded
    if verdict is not None:  # a wheel is mended by a sound wheel, never by copying files into it
        for f in report["failures"]:
            if f["fix"] in restore:
                f["fix"] = FIX_DOWNLOAD
        report["failures"] += [{"key": None, "release": None, "file": str(wheel), "what": "wheel", "serving": True,
                                "error": p, "fix": verdict["fix"]} for p in verdict["problems"]]
        report["failed"] = len(report["failures"])
        report["fixes"] = fixes(report["failures"], Path(shown))
    return report
